//! dmda: StarPU's deque model data aware policy, as an online policy.

use super::common::Plan;
use super::graph::CostGraph;
use super::schedule::Schedule;

/// dmda: tasks in submission order as they become ready — repeatedly the first task in
/// input order whose predecessors are all placed ([`CostGraph::topological_order`]) —
/// each appended to the queue of the processor where it is expected to finish first:
/// after the processor's last queued task and once its inputs have arrived, plus its
/// cost. No insertion into idle gaps. Ties: the lowest processor index.
pub fn dmda(graph: &CostGraph) -> Schedule {
    let mut plan = Plan::new(graph);
    for &t in graph.topological_order() {
        if let Some((p, _)) = plan.best_processor(t, |p| plan.earliest(t, p, false).1) {
            let (start, _) = plan.earliest(t, p, false);
            plan.place(t, p, start);
        }
    }
    plan.into_schedule()
}
