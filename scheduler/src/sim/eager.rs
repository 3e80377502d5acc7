//! eager: one central FIFO of ready tasks, placement blind to costs.

use std::collections::VecDeque;

use super::events::{simulate, ReadyQueue};
use super::graph::CostGraph;
use super::schedule::Schedule;

/// The central FIFO.
struct Fifo(VecDeque<usize>);

impl ReadyQueue for Fifo {
    fn push(&mut self, _graph: &CostGraph, tasks: &[usize], _finished_on: Option<usize>) {
        self.0.extend(tasks.iter().copied());
    }

    fn take(&mut self, graph: &CostGraph, p: usize) -> Option<usize> {
        let at = self.0.iter().position(|&t| graph.can_run(t, p))?;
        self.0.remove(at)
    }
}

/// eager: ready tasks join one FIFO (those made ready at the same moment in input
/// order); whenever a processor is idle (lowest index first) it takes the oldest task
/// it can run. Costs play no part in the placement; a task waits on its processor for
/// its inputs to arrive.
pub fn eager(graph: &CostGraph) -> Schedule {
    simulate(graph, &mut Fifo(VecDeque::new()))
}
