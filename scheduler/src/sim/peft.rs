//! PEFT: Predict Earliest Finish Time (Arabnejad & Barbosa 2014).

use super::common::{list_schedule, rank_keys};
use super::graph::CostGraph;
use super::schedule::Schedule;

/// The Optimistic Cost Table: `oct[t][p]` is, with task `t` on processor `p`, the
/// longest time from `t`'s finish to the end of the graph when every later task runs
/// on the processor best for it, ignoring processor contention:
/// `OCT(t, p) = max over children c of min over processors w that can run c of
/// (OCT(c, w) + cost(c, w) + comm(t→c, p, w))`, and 0 for a task without children.
///
/// The paper charges the mean transfer time between different processors; with the
/// default links this is the same number, and with a links matrix it is the transfer
/// over the actual link.
pub fn optimistic_cost_table(graph: &CostGraph) -> Vec<Vec<f64>> {
    let procs = graph.num_processors();
    let mut oct = vec![vec![0.0f64; procs]; graph.num_tasks()];
    for &t in graph.topological_order().iter().rev() {
        for p in 0..procs {
            let mut longest = 0.0f64;
            for &e in graph.out_edges(t) {
                let c = graph.edges()[e].to;
                let shortest = (0..procs)
                    .filter(|&w| graph.can_run(c, w))
                    .map(|w| oct[c][w] + graph.cost(c, w) + graph.comm(e, p, w))
                    .fold(f64::INFINITY, f64::min);
                if shortest.is_finite() {
                    longest = longest.max(shortest);
                }
            }
            oct[t][p] = longest;
        }
    }
    oct
}

/// PEFT: among the ready tasks, the one with the largest mean OCT over the processors
/// it can run on (ties: earlier in [`CostGraph::topological_order`]) goes on the
/// processor minimising its earliest finish time (insertion-based) plus its OCT there
/// (ties: the lowest processor index).
pub fn peft(graph: &CostGraph) -> Schedule {
    let oct = optimistic_cost_table(graph);
    let ranks: Vec<f64> = (0..graph.num_tasks())
        .map(|t| {
            let (sum, count) = (0..graph.num_processors())
                .filter(|&p| graph.can_run(t, p))
                .fold((0.0, 0usize), |(s, n), p| (s + oct[t][p], n + 1));
            if count == 0 {
                0.0
            } else {
                sum / count as f64
            }
        })
        .collect();
    let keys = rank_keys(&ranks);
    list_schedule(graph, &keys, |plan, t| {
        if let Some((p, _)) = plan.best_processor(t, |p| plan.earliest(t, p, true).1 + oct[t][p]) {
            let (start, _) = plan.earliest(t, p, true);
            plan.place(t, p, start);
        }
    })
}
