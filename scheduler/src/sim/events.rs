//! The event-driven simulation shared by the dynamic policies (`eager`, `ws`): tasks
//! become ready when their predecessors finish, and an idle processor takes one.

use super::common::Plan;
use super::graph::CostGraph;
use super::schedule::Schedule;

/// Where ready tasks wait until a processor takes them.
pub(crate) trait ReadyQueue {
    /// `tasks` (in input order) have become ready because a task finished on
    /// `finished_on`; `None` for the tasks ready at the start.
    fn push(&mut self, graph: &CostGraph, tasks: &[usize], finished_on: Option<usize>);
    /// The task idle processor `p` takes, if any (one it can run).
    fn take(&mut self, graph: &CostGraph, p: usize) -> Option<usize>;
}

/// Simulates the execution: at each moment, first every task finishing then completes
/// (by processor index) and releases the successors it made ready; then every idle
/// processor, by index, asks `queue` for a task. A processor that takes a task at time
/// `now` is busy until the task's finish; the task starts at `now` or when its inputs
/// arrive, whichever is later.
pub(crate) fn simulate(graph: &CostGraph, queue: &mut impl ReadyQueue) -> Schedule {
    let procs = graph.num_processors();
    let mut plan = Plan::new(graph);
    let mut missing: Vec<usize> = (0..graph.num_tasks())
        .map(|t| graph.in_edges(t).len())
        .collect();
    let initial: Vec<usize> = (0..graph.num_tasks())
        .filter(|&t| missing[t] == 0)
        .collect();
    queue.push(graph, &initial, None);
    let mut running: Vec<Option<usize>> = vec![None; procs];
    let mut now = 0.0f64;
    loop {
        for (p, slot) in running.iter_mut().enumerate() {
            if slot.is_none() {
                if let Some(t) = queue.take(graph, p) {
                    let start = now.max(plan.data_ready(t, p));
                    plan.place(t, p, start);
                    *slot = Some(t);
                }
            }
        }
        let next = running
            .iter()
            .flatten()
            .map(|&t| plan.finish[t])
            .fold(f64::INFINITY, f64::min);
        if !next.is_finite() {
            break;
        }
        now = next;
        for (p, slot) in running.iter_mut().enumerate() {
            let Some(t) = *slot else { continue };
            if plan.finish[t] > now {
                continue;
            }
            *slot = None;
            let mut released = Vec::new();
            for &e in graph.out_edges(t) {
                let c = graph.edges()[e].to;
                missing[c] -= 1;
                if missing[c] == 0 {
                    released.push(c);
                }
            }
            released.sort_unstable();
            queue.push(graph, &released, Some(p));
        }
    }
    plan.into_schedule()
}
