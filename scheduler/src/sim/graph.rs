//! The input of a simulation: processors, tasks with a cost on each processor, and
//! edges with the cost of moving their data between processors.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use xpu_hal::{Error, Result};

/// The most processors a graph may have: the policies scan every processor for every
/// task, and a JSON count above this is far more likely a typo than a machine.
pub const MAX_PROCESSORS: usize = 65_536;

/// A task: its id and its cost (time) on each processor.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// The task's id, unique in its graph and not empty.
    pub id: String,
    /// The task's run time on each processor, one entry per processor;
    /// [`f64::INFINITY`] where it cannot run. Finite entries must not be negative.
    pub cost: Vec<f64>,
}

/// A dependency: `to` starts after `from` finishes and its data has moved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Edge {
    /// Index of the producing task in [`CostGraph::tasks`].
    pub from: usize,
    /// Index of the consuming task in [`CostGraph::tasks`].
    pub to: usize,
    /// The transfer time when the two tasks run on different processors (before the
    /// link multiplier, see [`CostGraph::comm`]); finite and not negative.
    pub cost: f64,
}

/// A task graph with known costs on known processors: what the policies schedule.
///
/// Build one from JSON with [`CostGraph::from_json`] or from Rust with
/// [`CostGraph::new`]; both validate everything, so every `CostGraph` is a DAG whose
/// tasks can each run on at least one processor, with finite non-negative costs.
#[derive(Debug, Clone, PartialEq)]
pub struct CostGraph {
    processors: Vec<String>,
    tasks: Vec<Task>,
    edges: Vec<Edge>,
    /// `None`: the default links (1 between processors, 0 on one processor).
    links: Option<Vec<Vec<f64>>>,
    /// Incoming edge indices per task, in edge order.
    preds: Vec<Vec<usize>>,
    /// Outgoing edge indices per task, in edge order.
    succs: Vec<Vec<usize>>,
    /// Tasks in topological order; among the tasks ready at once, input order.
    topo: Vec<usize>,
    /// Position of each task in `topo`.
    topo_pos: Vec<usize>,
}

impl CostGraph {
    /// Validates and builds a graph.
    ///
    /// `processors` names the processors (the index of a name is its processor
    /// index); `links`, when given, is a `P × P` matrix of non-negative finite
    /// multipliers: moving the data of edge `e` from processor `p` to processor `q`
    /// takes `e.cost × links[p][q]`. Without it, that is `e.cost` between two
    /// processors and 0 on one.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming the culprit: no processors, duplicate or
    /// empty processor names or task ids, a cost vector of the wrong length, a
    /// negative or NaN cost, a task that can run on no processor, an edge naming a
    /// task index out of range, a self-edge, a duplicate edge, a cycle (naming the
    /// tasks on it), a links matrix of the wrong shape or with a negative, NaN or
    /// infinite entry.
    pub fn new(
        processors: Vec<String>,
        tasks: Vec<Task>,
        edges: Vec<Edge>,
        links: Option<Vec<Vec<f64>>>,
    ) -> Result<CostGraph> {
        let p = processors.len();
        if p == 0 {
            return Err(Error::invalid(
                "the graph has no processors: give at least one (\"processors\": 1, or a list of names)",
            ));
        }
        if p > MAX_PROCESSORS {
            return Err(Error::invalid(format!(
                "the graph has {p} processors, more than the {MAX_PROCESSORS} supported"
            )));
        }
        let mut names = HashMap::new();
        for (i, name) in processors.iter().enumerate() {
            if name.is_empty() {
                return Err(Error::invalid(format!(
                    "processor {i} has an empty name: name every processor"
                )));
            }
            if let Some(first) = names.insert(name.as_str(), i) {
                return Err(Error::invalid(format!(
                    "processors {first} and {i} are both named {name:?}: give each processor its own name"
                )));
            }
        }
        let mut ids = HashMap::new();
        for (i, task) in tasks.iter().enumerate() {
            if task.id.is_empty() {
                return Err(Error::invalid(format!(
                    "task {i} has an empty id: give every task an id"
                )));
            }
            if let Some(first) = ids.insert(task.id.as_str(), i) {
                return Err(Error::invalid(format!(
                    "task id {:?} is used by tasks {first} and {i}: give each task its own id",
                    task.id
                )));
            }
            if task.cost.len() != p {
                return Err(Error::invalid(format!(
                    "task {:?} has {} costs but there are {p} processors: give one cost per processor (null, or infinity from Rust, where it cannot run)",
                    task.id,
                    task.cost.len()
                )));
            }
            for (q, &c) in task.cost.iter().enumerate() {
                if c.is_nan() || c < 0.0 {
                    return Err(Error::invalid(format!(
                        "task {:?} has cost {c} on processor {q} ({}): costs must be non-negative numbers (null where it cannot run)",
                        task.id, processors[q]
                    )));
                }
            }
            if task.cost.iter().all(|c| c.is_infinite()) {
                return Err(Error::invalid(format!(
                    "task {:?} cannot run on any processor: give it a finite cost on at least one",
                    task.id
                )));
            }
        }
        let n = tasks.len();
        let mut preds = vec![Vec::new(); n];
        let mut succs = vec![Vec::new(); n];
        let mut pairs = HashMap::new();
        for (k, e) in edges.iter().enumerate() {
            if e.from >= n || e.to >= n {
                let bad = if e.from >= n { e.from } else { e.to };
                return Err(Error::invalid(format!(
                    "edge {k} names task index {bad}, but there are {n} tasks"
                )));
            }
            let (a, b) = (&tasks[e.from].id, &tasks[e.to].id);
            if e.from == e.to {
                return Err(Error::invalid(format!(
                    "edge {k} goes from task {a:?} to itself: remove it"
                )));
            }
            if !e.cost.is_finite() || e.cost < 0.0 {
                return Err(Error::invalid(format!(
                    "edge {k} ({a:?} -> {b:?}) has cost {}: transfer costs must be finite non-negative numbers",
                    e.cost
                )));
            }
            if let Some(first) = pairs.insert((e.from, e.to), k) {
                return Err(Error::invalid(format!(
                    "edges {first} and {k} both go from {a:?} to {b:?}: give one edge (with the total transfer cost)"
                )));
            }
            preds[e.to].push(k);
            succs[e.from].push(k);
        }
        if let Some(links) = &links {
            if links.len() != p || links.iter().any(|row| row.len() != p) {
                return Err(Error::invalid(format!(
                    "links must be a {p} × {p} matrix (one row per source processor, one entry per destination), not {} rows of lengths {:?}",
                    links.len(),
                    links.iter().map(Vec::len).collect::<Vec<_>>()
                )));
            }
            for (a, row) in links.iter().enumerate() {
                for (b, &m) in row.iter().enumerate() {
                    if !m.is_finite() || m < 0.0 {
                        return Err(Error::invalid(format!(
                            "links[{a}][{b}] ({} -> {}) is {m}: link multipliers must be finite non-negative numbers",
                            processors[a], processors[b]
                        )));
                    }
                }
            }
        }
        let topo = topological_order(&tasks, &edges, &preds, &succs)?;
        let mut topo_pos = vec![0; n];
        for (pos, &t) in topo.iter().enumerate() {
            topo_pos[t] = pos;
        }
        Ok(CostGraph {
            processors,
            tasks,
            edges,
            links,
            preds,
            succs,
            topo,
            topo_pos,
        })
    }

    /// Parses and validates a graph in the JSON format of the module documentation
    /// ([`crate::sim`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`]: malformed JSON (with serde's line and column), a
    /// field of the wrong type, or anything [`CostGraph::new`] refuses.
    pub fn from_json(text: &str) -> Result<CostGraph> {
        let raw: RawGraph = serde_json::from_str(text).map_err(|e| {
            Error::invalid(format!("the graph is not valid JSON of a cost graph: {e}"))
        })?;
        raw.into_graph()
    }

    /// The graph in the JSON format [`CostGraph::from_json`] reads (infinite costs as
    /// `null`; `links` only when given). Numbers are written in full, but serde_json
    /// parses them back to within the last bit unless its `float_roundtrip` feature is
    /// on.
    pub fn to_json(&self) -> String {
        let raw = RawGraphOut {
            processors: &self.processors,
            tasks: self
                .tasks
                .iter()
                .map(|t| RawTaskOut {
                    id: &t.id,
                    cost: t.cost.iter().map(|&c| c.is_finite().then_some(c)).collect(),
                })
                .collect(),
            edges: self
                .edges
                .iter()
                .map(|e| RawEdgeOut {
                    from: &self.tasks[e.from].id,
                    to: &self.tasks[e.to].id,
                    cost: e.cost,
                })
                .collect(),
            links: self.links.as_ref(),
        };
        // Serialising plain strings, finite numbers and nulls cannot fail.
        serde_json::to_string_pretty(&raw).unwrap_or_default()
    }

    /// Default processor names for `count` processors: `p0`, `p1`, ….
    pub fn default_processor_names(count: usize) -> Vec<String> {
        (0..count).map(|i| format!("p{i}")).collect()
    }

    /// The processors' names; a processor's index is its position here.
    pub fn processors(&self) -> &[String] {
        &self.processors
    }

    /// The number of processors.
    pub fn num_processors(&self) -> usize {
        self.processors.len()
    }

    /// The tasks, in input order.
    pub fn tasks(&self) -> &[Task] {
        &self.tasks
    }

    /// The number of tasks.
    pub fn num_tasks(&self) -> usize {
        self.tasks.len()
    }

    /// The edges, in input order.
    pub fn edges(&self) -> &[Edge] {
        &self.edges
    }

    /// The links matrix when one was given (`None`: 1 between processors, 0 on one).
    pub fn links(&self) -> Option<&[Vec<f64>]> {
        self.links.as_deref()
    }

    /// The link multiplier from processor `from` to processor `to`.
    pub fn link(&self, from: usize, to: usize) -> f64 {
        match &self.links {
            Some(links) => links[from][to],
            None if from == to => 0.0,
            None => 1.0,
        }
    }

    /// The transfer time of edge `edge` when its producer runs on processor `from` and
    /// its consumer on processor `to`: the edge's cost times the link multiplier.
    pub fn comm(&self, edge: usize, from: usize, to: usize) -> f64 {
        let cost = self.edges[edge].cost;
        if cost == 0.0 {
            0.0
        } else {
            cost * self.link(from, to)
        }
    }

    /// Task `task`'s cost on processor `processor` ([`f64::INFINITY`] where it cannot run).
    pub fn cost(&self, task: usize, processor: usize) -> f64 {
        self.tasks[task].cost[processor]
    }

    /// Whether task `task` can run on processor `processor`.
    pub fn can_run(&self, task: usize, processor: usize) -> bool {
        self.tasks[task].cost[processor].is_finite()
    }

    /// The indices of the edges into task `task`, in edge order.
    pub fn in_edges(&self, task: usize) -> &[usize] {
        &self.preds[task]
    }

    /// The indices of the edges out of task `task`, in edge order.
    pub fn out_edges(&self, task: usize) -> &[usize] {
        &self.succs[task]
    }

    /// The tasks in a topological order: repeatedly the first task in input order whose
    /// predecessors are all listed (the order in which `dmda` meets them).
    pub fn topological_order(&self) -> &[usize] {
        &self.topo
    }

    /// The position of task `task` in [`CostGraph::topological_order`].
    pub fn topological_position(&self, task: usize) -> usize {
        self.topo_pos[task]
    }

    /// The index of the task with id `id`.
    pub fn task_index(&self, id: &str) -> Option<usize> {
        self.tasks.iter().position(|t| t.id == id)
    }

    /// Task `task`'s smallest cost over the processors it can run on.
    pub fn min_cost(&self, task: usize) -> f64 {
        self.tasks[task]
            .cost
            .iter()
            .copied()
            .filter(|c| c.is_finite())
            .fold(f64::INFINITY, f64::min)
    }

    /// Task `task`'s mean cost over the processors it can run on.
    pub fn mean_cost(&self, task: usize) -> f64 {
        let (sum, count) = self.tasks[task]
            .cost
            .iter()
            .filter(|c| c.is_finite())
            .fold((0.0, 0usize), |(s, n), &c| (s + c, n + 1));
        if count == 0 {
            0.0
        } else {
            sum / count as f64
        }
    }

    /// Edge `edge`'s mean transfer time: the mean of [`CostGraph::comm`] over the pairs
    /// of different processors its producer and its consumer can run on (over every
    /// pair they can run on, the same processor included, when there is no such pair).
    /// With the default links this is the edge's cost, as in HEFT's paper.
    pub fn mean_comm(&self, edge: usize) -> f64 {
        let e = self.edges[edge];
        if e.cost == 0.0 {
            return 0.0;
        }
        if self.links.is_none() {
            let only_same = (0..self.num_processors())
                .filter(|&p| self.can_run(e.from, p))
                .all(|p| (0..self.num_processors()).all(|q| q == p || !self.can_run(e.to, q)));
            return if only_same { 0.0 } else { e.cost };
        }
        let mut sum = 0.0;
        let mut count = 0usize;
        let mut same_sum = 0.0;
        let mut same_count = 0usize;
        for p in (0..self.num_processors()).filter(|&p| self.can_run(e.from, p)) {
            for q in (0..self.num_processors()).filter(|&q| self.can_run(e.to, q)) {
                if p == q {
                    same_sum += self.comm(edge, p, q);
                    same_count += 1;
                } else {
                    sum += self.comm(edge, p, q);
                    count += 1;
                }
            }
        }
        if count > 0 {
            sum / count as f64
        } else if same_count > 0 {
            same_sum / same_count as f64
        } else {
            0.0
        }
    }

    /// A lower bound on any schedule's makespan: the larger of the critical path with
    /// every task at its smallest cost and no transfers, and the sum of the smallest
    /// costs spread evenly over the processors.
    pub fn lower_bound(&self) -> f64 {
        let work: f64 = (0..self.num_tasks()).map(|t| self.min_cost(t)).sum();
        self.critical_path_lower_bound()
            .max(work / self.num_processors() as f64)
    }

    /// The critical path with every task at its smallest cost and no transfers.
    pub fn critical_path_lower_bound(&self) -> f64 {
        let mut longest = vec![0.0f64; self.num_tasks()];
        let mut path = 0.0f64;
        for &t in &self.topo {
            let ready = self.preds[t]
                .iter()
                .map(|&e| longest[self.edges[e].from])
                .fold(0.0, f64::max);
            longest[t] = ready + self.min_cost(t);
            path = path.max(longest[t]);
        }
        path
    }
}

/// Kahn's algorithm, taking the ready task first in input order; on a cycle, an error
/// naming the tasks on one.
fn topological_order(
    tasks: &[Task],
    edges: &[Edge],
    preds: &[Vec<usize>],
    succs: &[Vec<usize>],
) -> Result<Vec<usize>> {
    let n = tasks.len();
    let mut missing: Vec<usize> = preds.iter().map(Vec::len).collect();
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> = (0..n)
        .filter(|&t| missing[t] == 0)
        .map(std::cmp::Reverse)
        .collect();
    let mut order = Vec::with_capacity(n);
    while let Some(std::cmp::Reverse(t)) = ready.pop() {
        order.push(t);
        for &e in &succs[t] {
            let to = edges[e].to;
            missing[to] -= 1;
            if missing[to] == 0 {
                ready.push(std::cmp::Reverse(to));
            }
        }
    }
    if order.len() == n {
        return Ok(order);
    }
    // Every task left has a predecessor left: walking back along those edges from any
    // of them must revisit a task, and the tasks from its first visit on form a cycle.
    let start = (0..n).find(|&t| missing[t] > 0).unwrap_or(0);
    let mut seen = vec![usize::MAX; n];
    let mut walk = Vec::new();
    let mut t = start;
    while seen[t] == usize::MAX {
        seen[t] = walk.len();
        walk.push(t);
        match preds[t]
            .iter()
            .map(|&e| edges[e].from)
            .find(|&f| missing[f] > 0)
        {
            Some(f) => t = f,
            None => break,
        }
    }
    let cycle_start = if seen[t] == usize::MAX { 0 } else { seen[t] };
    let mut cycle: Vec<usize> = walk[cycle_start..].to_vec();
    cycle.reverse();
    // Start the cycle at its task first in input order, so the message is stable.
    if let Some(first) = (0..cycle.len()).min_by_key(|&i| cycle[i]) {
        cycle.rotate_left(first);
    }
    let mut text = String::new();
    for &c in &cycle {
        let _ = write!(text, "{:?} -> ", tasks[c].id);
    }
    if let Some(&first) = cycle.first() {
        let _ = write!(text, "{:?}", tasks[first].id);
    }
    Err(Error::invalid(format!(
        "the graph has a cycle through task {:?} ({text}): remove one of its edges",
        tasks[cycle.first().copied().unwrap_or(start)].id
    )))
}

/// The JSON graph as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGraph {
    processors: serde_json::Value,
    #[serde(default)]
    tasks: Vec<RawTask>,
    #[serde(default)]
    edges: Vec<RawEdge>,
    #[serde(default)]
    links: Option<Vec<Vec<f64>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTask {
    id: String,
    cost: serde_json::Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEdge {
    from: String,
    to: String,
    #[serde(default)]
    cost: f64,
}

#[derive(Serialize)]
struct RawGraphOut<'a> {
    processors: &'a [String],
    tasks: Vec<RawTaskOut<'a>>,
    edges: Vec<RawEdgeOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    links: Option<&'a Vec<Vec<f64>>>,
}

#[derive(Serialize)]
struct RawTaskOut<'a> {
    id: &'a str,
    cost: Vec<Option<f64>>,
}

#[derive(Serialize)]
struct RawEdgeOut<'a> {
    from: &'a str,
    to: &'a str,
    cost: f64,
}

impl RawGraph {
    fn into_graph(self) -> Result<CostGraph> {
        let processors = match &self.processors {
            serde_json::Value::Number(n) => match n.as_u64() {
                Some(count) if count as usize <= MAX_PROCESSORS => {
                    CostGraph::default_processor_names(count as usize)
                }
                Some(count) => {
                    return Err(Error::invalid(format!(
                        "\"processors\": {count} is more than the {MAX_PROCESSORS} supported"
                    )))
                }
                None => {
                    return Err(Error::invalid(format!(
                        "\"processors\": {n} is not a count: give a positive whole number or a list of names"
                    )))
                }
            },
            serde_json::Value::Array(names) => {
                let mut out = Vec::with_capacity(names.len());
                for (i, name) in names.iter().enumerate() {
                    match name.as_str() {
                        Some(s) => out.push(s.to_string()),
                        None => {
                            return Err(Error::invalid(format!(
                                "\"processors\"[{i}] is {name}, not a name: give a list of strings or a count"
                            )))
                        }
                    }
                }
                out
            }
            other => {
                return Err(Error::invalid(format!(
                    "\"processors\" is {other}: give a count (3) or a list of names ([\"cpu\", \"gpu\"])"
                )))
            }
        };
        let p = processors.len();
        let by_name: HashMap<&str, usize> = processors
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), i))
            .collect();
        let mut tasks = Vec::with_capacity(self.tasks.len());
        for raw in self.tasks {
            let cost = parse_cost(&raw.id, &raw.cost, p, &by_name, &processors)?;
            tasks.push(Task { id: raw.id, cost });
        }
        let mut index: HashMap<&str, usize> = HashMap::new();
        for (i, t) in tasks.iter().enumerate() {
            index.entry(t.id.as_str()).or_insert(i);
        }
        let mut edges = Vec::with_capacity(self.edges.len());
        for (k, raw) in self.edges.iter().enumerate() {
            let find = |id: &str, end: &str| {
                index.get(id).copied().ok_or_else(|| {
                    Error::invalid(format!(
                        "edge {k} ({:?} -> {:?}): its \"{end}\" task {id:?} is not in \"tasks\": add the task or fix the id",
                        raw.from, raw.to
                    ))
                })
            };
            let from = find(&raw.from, "from")?;
            let to = find(&raw.to, "to")?;
            edges.push(Edge {
                from,
                to,
                cost: raw.cost,
            });
        }
        CostGraph::new(processors, tasks, edges, self.links)
    }
}

/// A task's `cost`: a list of one number (or `null`) per processor, or an object from
/// processor names to numbers (a processor left out, or `null`, cannot run the task).
fn parse_cost(
    id: &str,
    value: &serde_json::Value,
    p: usize,
    by_name: &HashMap<&str, usize>,
    processors: &[String],
) -> Result<Vec<f64>> {
    let number = |v: &serde_json::Value, at: &str| -> Result<f64> {
        match v {
            serde_json::Value::Null => Ok(f64::INFINITY),
            serde_json::Value::Number(n) => n.as_f64().ok_or_else(|| {
                Error::invalid(format!("task {id:?}: cost {at} ({n}) is not a number"))
            }),
            other => Err(Error::invalid(format!(
                "task {id:?}: cost {at} is {other}: give a number, or null where the task cannot run"
            ))),
        }
    };
    match value {
        serde_json::Value::Array(items) => {
            if items.len() != p {
                return Err(Error::invalid(format!(
                    "task {id:?} has {} costs but there are {p} processors: give one cost per processor (null where it cannot run)",
                    items.len()
                )));
            }
            items
                .iter()
                .enumerate()
                .map(|(q, v)| number(v, &format!("on processor {q} ({})", processors[q])))
                .collect()
        }
        serde_json::Value::Object(map) => {
            let mut cost = vec![f64::INFINITY; p];
            let sorted: BTreeMap<&String, &serde_json::Value> = map.iter().collect();
            for (name, v) in sorted {
                let Some(&q) = by_name.get(name.as_str()) else {
                    return Err(Error::invalid(format!(
                        "task {id:?}: cost names processor {name:?}, which is not one of {processors:?}"
                    )));
                };
                cost[q] = number(v, &format!("on processor {q} ({name})"))?;
            }
            Ok(cost)
        }
        other => Err(Error::invalid(format!(
            "task {id:?}: \"cost\" is {other}: give a list with one cost per processor, or an object from processor names to costs"
        ))),
    }
}
