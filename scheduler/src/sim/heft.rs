//! HEFT (Topcuoglu, Hariri & Wu 2002) and HEFT with one-level lookahead (Bittencourt,
//! Sakellariou & Madeira 2010).

use super::common::{clearly_less, list_schedule, rank_keys, Plan};
use super::graph::CostGraph;
use super::schedule::Schedule;

/// Each task's upward rank: its mean cost plus the largest, over its out-edges, of the
/// edge's mean transfer time plus the successor's upward rank.
pub fn upward_ranks(graph: &CostGraph) -> Vec<f64> {
    let mut rank = vec![0.0f64; graph.num_tasks()];
    for &t in graph.topological_order().iter().rev() {
        let tail = graph
            .out_edges(t)
            .iter()
            .map(|&e| graph.mean_comm(e) + rank[graph.edges()[e].to])
            .fold(0.0, f64::max);
        rank[t] = graph.mean_cost(t) + tail;
    }
    rank
}

/// The order in which [`heft`] and [`heft_la`] place the tasks: by decreasing upward
/// rank, ties (to within one part in 10¹²) in [`CostGraph::topological_order`].
pub fn heft_order(graph: &CostGraph) -> Vec<usize> {
    let keys = rank_keys(&upward_ranks(graph));
    let mut order: Vec<usize> = (0..graph.num_tasks()).collect();
    order.sort_by_key(|&t| (std::cmp::Reverse(keys[t]), graph.topological_position(t)));
    order
}

/// HEFT: tasks by decreasing upward rank (ties: earlier in
/// [`CostGraph::topological_order`]), each on the processor where it finishes
/// earliest, in the first idle gap it fits (ties: the lowest processor index).
pub fn heft(graph: &CostGraph) -> Schedule {
    let keys = rank_keys(&upward_ranks(graph));
    list_schedule(graph, &keys, |plan, t| {
        if let Some((p, _)) = plan.best_processor(t, |p| plan.earliest(t, p, true).1) {
            let (start, _) = plan.earliest(t, p, true);
            plan.place(t, p, start);
        }
    })
}

/// HEFT with lookahead: HEFT's order and insertion, but each task goes on the
/// processor that minimises the largest finish time of its children when they are
/// then placed tentatively, in HEFT's order, each on its earliest-finish processor
/// (counting only their predecessors placed so far). A task without children is
/// placed as HEFT would. Ties: the smaller finish time of the task itself, then the
/// lowest processor index.
pub fn heft_la(graph: &CostGraph) -> Schedule {
    let keys = rank_keys(&upward_ranks(graph));
    list_schedule(graph, &keys, |plan, t| {
        let mut children: Vec<usize> = graph
            .out_edges(t)
            .iter()
            .map(|&e| graph.edges()[e].to)
            .collect();
        children.sort_by_key(|&c| (std::cmp::Reverse(keys[c]), graph.topological_position(c)));
        let mut best: Option<(usize, f64, f64, f64)> = None; // (p, metric, start, finish)
        for p in (0..graph.num_processors()).filter(|&p| graph.can_run(t, p)) {
            let (start, finish) = plan.earliest(t, p, true);
            let metric = if children.is_empty() {
                finish
            } else {
                lookahead(plan, t, p, start, &children)
            };
            let better = match best {
                None => true,
                Some((_, m, _, f)) => {
                    clearly_less(metric, m) || (!clearly_less(m, metric) && clearly_less(finish, f))
                }
            };
            if better {
                best = Some((p, metric, start, finish));
            }
        }
        if let Some((p, _, start, _)) = best {
            plan.place(t, p, start);
        }
    })
}

/// The largest finish time of `children` placed tentatively after `task` on `p` from
/// `start`; the plan is left as it was.
fn lookahead(plan: &mut Plan<'_>, task: usize, p: usize, start: f64, children: &[usize]) -> f64 {
    let mut undo = Vec::with_capacity(children.len() + 1);
    undo.push((task, plan.place(task, p, start)));
    let mut worst = 0.0f64;
    for &c in children {
        if let Some((q, _)) = plan.best_processor(c, |q| plan.earliest(c, q, true).1) {
            let (s, f) = plan.earliest(c, q, true);
            undo.push((c, plan.place(c, q, s)));
            worst = worst.max(f);
        }
    }
    for (t, at) in undo.into_iter().rev() {
        plan.unplace(t, at);
    }
    worst
}
