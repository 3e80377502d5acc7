//! ws: work stealing over per-processor deques.

use std::collections::VecDeque;

use super::events::{simulate, ReadyQueue};
use super::graph::CostGraph;
use super::schedule::Schedule;

/// One deque per processor, and the round-robin position for the initial tasks.
struct Deques {
    deques: Vec<VecDeque<usize>>,
    next: usize,
}

impl Deques {
    /// The first processor from `from` on (cyclically) that can run `task`.
    fn home(graph: &CostGraph, task: usize, from: usize) -> usize {
        let procs = graph.num_processors();
        (0..procs)
            .map(|i| (from + i) % procs)
            .find(|&q| graph.can_run(task, q))
            .unwrap_or(0)
    }
}

impl ReadyQueue for Deques {
    fn push(&mut self, graph: &CostGraph, tasks: &[usize], finished_on: Option<usize>) {
        let procs = graph.num_processors();
        for &t in tasks {
            let q = match finished_on {
                Some(p) => Self::home(graph, t, p),
                None => {
                    let q = Self::home(graph, t, self.next % procs);
                    self.next = (q + 1) % procs;
                    q
                }
            };
            self.deques[q].push_back(t);
        }
    }

    fn take(&mut self, graph: &CostGraph, p: usize) -> Option<usize> {
        if let Some(at) = self.deques[p].iter().rposition(|&t| graph.can_run(t, p)) {
            return self.deques[p].remove(at);
        }
        let mut victims: Vec<usize> = (0..self.deques.len()).filter(|&v| v != p).collect();
        victims.sort_by_key(|&v| (std::cmp::Reverse(self.deques[v].len()), v));
        for v in victims {
            if let Some(at) = self.deques[v].iter().position(|&t| graph.can_run(t, p)) {
                return self.deques[v].remove(at);
            }
        }
        None
    }
}

/// ws: work stealing. The tasks ready at the start are dealt round-robin over the
/// processors in input order; a task made ready by a task finishing on processor `p`
/// is pushed on `p`'s deque. An idle processor (lowest index first) pops the newest
/// task of its own deque, else steals the oldest task it can run from the most loaded
/// other processor (the most queued tasks, ties to the lowest index) that has one. A
/// task goes to the deque of the first processor, from the intended one on cyclically,
/// that can run it.
pub fn ws(graph: &CostGraph) -> Schedule {
    simulate(
        graph,
        &mut Deques {
            deques: vec![VecDeque::new(); graph.num_processors()],
            next: 0,
        },
    )
}
