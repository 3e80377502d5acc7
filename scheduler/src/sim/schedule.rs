//! The output of a simulation: where and when each task runs.

use serde::{Deserialize, Serialize};

use super::graph::CostGraph;

/// One task's placement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Placed {
    /// The task's id.
    pub id: String,
    /// The index of the processor it runs on (in [`CostGraph::processors`]).
    pub processor: usize,
    /// When it starts.
    pub start: f64,
    /// When it finishes: `start` plus its cost on `processor`.
    pub finish: f64,
}

/// A schedule: every task's placement, in the graph's task order, and the makespan.
///
/// Serialises as `{"makespan": T, "tasks": [{"id", "processor", "start", "finish"}]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// The latest finish time (0 for a graph without tasks).
    pub makespan: f64,
    /// One entry per task, in the graph's task order.
    pub tasks: Vec<Placed>,
}

/// Relative tolerance of [`Schedule::validate`]'s comparisons, for schedules computed
/// elsewhere or read back from decimal text.
const TOLERANCE: f64 = 1e-9;

impl Schedule {
    /// Checks that this is a valid schedule of `graph`: one placement per task in task
    /// order with the task's id, each on a processor where the task can run, finishing
    /// its cost after it starts, no earlier than time 0; each task starting no earlier
    /// than each predecessor's finish plus the edge's transfer time between their
    /// processors ([`CostGraph::comm`]); no two tasks overlapping on a processor (a
    /// task of zero cost may sit at another's start or finish, not inside it); and the
    /// makespan the latest finish. Times are compared with a relative tolerance of
    /// 10⁻⁹ of the largest time.
    ///
    /// # Errors
    ///
    /// A message naming the first violation found.
    pub fn validate(&self, graph: &CostGraph) -> Result<(), String> {
        if self.tasks.len() != graph.num_tasks() {
            return Err(format!(
                "the schedule places {} tasks but the graph has {}",
                self.tasks.len(),
                graph.num_tasks()
            ));
        }
        let scale = self
            .tasks
            .iter()
            .map(|t| t.finish.abs().max(t.start.abs()))
            .fold(self.makespan.abs(), f64::max);
        let tol = TOLERANCE * scale;
        let p = graph.num_processors();
        for (i, (placed, task)) in self.tasks.iter().zip(graph.tasks()).enumerate() {
            if placed.id != task.id {
                return Err(format!(
                    "entry {i} is task {:?} but the graph's task {i} is {:?}",
                    placed.id, task.id
                ));
            }
            if placed.processor >= p {
                return Err(format!(
                    "task {:?} is on processor {}, but there are {p}",
                    task.id, placed.processor
                ));
            }
            let cost = graph.cost(i, placed.processor);
            if !cost.is_finite() {
                return Err(format!(
                    "task {:?} is on processor {} ({}), where it cannot run",
                    task.id,
                    placed.processor,
                    graph.processors()[placed.processor]
                ));
            }
            if !placed.start.is_finite() || !placed.finish.is_finite() || placed.start < -tol {
                return Err(format!(
                    "task {:?} runs from {} to {}: times must be finite and not negative",
                    task.id, placed.start, placed.finish
                ));
            }
            if (placed.finish - (placed.start + cost)).abs() > tol {
                return Err(format!(
                    "task {:?} runs from {} to {} on processor {}, but its cost there is {cost}",
                    task.id, placed.start, placed.finish, placed.processor
                ));
            }
        }
        for (k, e) in graph.edges().iter().enumerate() {
            let (a, b) = (&self.tasks[e.from], &self.tasks[e.to]);
            let comm = graph.comm(k, a.processor, b.processor);
            if b.start < a.finish + comm - tol {
                return Err(format!(
                    "task {:?} starts at {} on processor {}, before its input from {:?} (finished at {} on processor {}) arrives at {} (edge {k}, transfer {comm})",
                    b.id,
                    b.start,
                    b.processor,
                    a.id,
                    a.finish,
                    a.processor,
                    a.finish + comm
                ));
            }
        }
        for (q, order) in self.by_processor(p).iter().enumerate() {
            let mut busy_until = f64::NEG_INFINITY;
            let mut last: Option<usize> = None;
            for &t in order {
                let placed = &self.tasks[t];
                if let Some(prev) = last {
                    if placed.start < busy_until - tol {
                        return Err(format!(
                            "tasks {:?} ({} to {}) and {:?} ({} to {}) overlap on processor {q}",
                            self.tasks[prev].id,
                            self.tasks[prev].start,
                            self.tasks[prev].finish,
                            placed.id,
                            placed.start,
                            placed.finish
                        ));
                    }
                }
                if placed.finish >= busy_until {
                    busy_until = placed.finish;
                    last = Some(t);
                }
            }
        }
        let latest = self.tasks.iter().map(|t| t.finish).fold(0.0, f64::max);
        if (self.makespan - latest).abs() > tol {
            return Err(format!(
                "the makespan is {} but the last task finishes at {latest}",
                self.makespan
            ));
        }
        Ok(())
    }

    /// For each of `processors` processors, the indices (into [`Schedule::tasks`]) of
    /// the tasks on it, by start time (then finish time, then task order). Entries on a
    /// processor index out of range are left out.
    pub fn by_processor(&self, processors: usize) -> Vec<Vec<usize>> {
        let mut lists = vec![Vec::new(); processors];
        for (i, t) in self.tasks.iter().enumerate() {
            if let Some(list) = lists.get_mut(t.processor) {
                list.push(i);
            }
        }
        for list in &mut lists {
            list.sort_by(|&a, &b| {
                let (x, y) = (&self.tasks[a], &self.tasks[b]);
                x.start
                    .total_cmp(&y.start)
                    .then(x.finish.total_cmp(&y.finish))
                    .then(a.cmp(&b))
            });
        }
        lists
    }

    /// The schedule as JSON: `{"makespan", "tasks": [{"id", "processor", "start",
    /// "finish"}]}`.
    pub fn to_json(&self) -> String {
        // Strings and numbers always serialise (a non-finite number becomes null).
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}
