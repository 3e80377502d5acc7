//! What the policies share: a schedule under construction, processor timelines with
//! insertion, deterministic comparisons.

use super::graph::CostGraph;
use super::schedule::{Placed, Schedule};

/// Relative difference under which two times or ranks count as equal when a policy
/// chooses, so that rounding noise cannot decide a tie (ties are then broken by the
/// documented rules).
pub(crate) const TIE: f64 = 1e-12;

/// `a` is smaller than `b` by more than rounding noise.
pub(crate) fn clearly_less(a: f64, b: f64) -> bool {
    a < b - TIE * a.abs().max(b.abs())
}

/// Integer priority keys for `ranks` (all finite and non-negative): equal to within
/// [`TIE`] of the largest rank becomes equal, and the mapping is monotone, so a rank
/// that is at least another's gets a key that is at least the other's.
pub(crate) fn rank_keys(ranks: &[f64]) -> Vec<u64> {
    let max = ranks.iter().copied().fold(0.0, f64::max);
    if max <= 0.0 || !max.is_finite() {
        return vec![0; ranks.len()];
    }
    ranks
        .iter()
        .map(|&r| ((r / max) * (1.0 / TIE)).round() as u64)
        .collect()
}

/// The busy intervals of one processor, sorted by start.
#[derive(Debug, Clone, Default)]
pub(crate) struct Timeline {
    busy: Vec<(f64, f64)>,
    end: f64,
}

impl Timeline {
    /// The earliest start no earlier than `ready` for a task of length `length`: in
    /// the first idle gap it fits (insertion) when `insert`, else after the last task.
    pub(crate) fn earliest_start(&self, ready: f64, length: f64, insert: bool) -> f64 {
        if !insert {
            return ready.max(self.end());
        }
        let mut free_from = 0.0f64;
        for &(s, f) in &self.busy {
            let start = ready.max(free_from);
            if start + length <= s {
                return start;
            }
            free_from = free_from.max(f);
        }
        ready.max(free_from)
    }

    /// When the processor's last task finishes (0 when it has none).
    pub(crate) fn end(&self) -> f64 {
        self.end
    }

    /// Records a task from `start` to `finish`; returns its position for [`Timeline::remove`].
    pub(crate) fn add(&mut self, start: f64, finish: f64) -> usize {
        let at = self
            .busy
            .partition_point(|&(s, f)| s < start || (s == start && f <= finish));
        self.busy.insert(at, (start, finish));
        self.end = self.end.max(finish);
        at
    }

    /// Removes the entry [`Timeline::add`] put at `at` (entries added later must have
    /// been removed first).
    pub(crate) fn remove(&mut self, at: usize) {
        if at < self.busy.len() {
            self.busy.remove(at);
            self.end = self.busy.iter().map(|&(_, f)| f).fold(0.0, f64::max);
        }
    }
}

/// A schedule under construction.
#[derive(Debug, Clone)]
pub(crate) struct Plan<'g> {
    pub(crate) graph: &'g CostGraph,
    pub(crate) processor: Vec<Option<usize>>,
    pub(crate) start: Vec<f64>,
    pub(crate) finish: Vec<f64>,
    pub(crate) timelines: Vec<Timeline>,
}

impl<'g> Plan<'g> {
    pub(crate) fn new(graph: &'g CostGraph) -> Self {
        let n = graph.num_tasks();
        Plan {
            graph,
            processor: vec![None; n],
            start: vec![0.0; n],
            finish: vec![0.0; n],
            timelines: vec![Timeline::default(); graph.num_processors()],
        }
    }

    /// When all of `task`'s inputs from placed predecessors are on processor `p`:
    /// each predecessor's finish plus the edge's transfer time (0 with no placed
    /// predecessor).
    pub(crate) fn data_ready(&self, task: usize, p: usize) -> f64 {
        let g = self.graph;
        g.in_edges(task)
            .iter()
            .filter_map(|&e| {
                let from = g.edges()[e].from;
                self.processor[from].map(|q| self.finish[from] + g.comm(e, q, p))
            })
            .fold(0.0, f64::max)
    }

    /// The earliest (start, finish) of `task` on `p` (which must be able to run it).
    pub(crate) fn earliest(&self, task: usize, p: usize, insert: bool) -> (f64, f64) {
        let cost = self.graph.cost(task, p);
        let start = self.timelines[p].earliest_start(self.data_ready(task, p), cost, insert);
        (start, start + cost)
    }

    /// The processor (that can run `task`) minimising `score(p)`; ties go to the lowest
    /// index. `None` only for a task that can run nowhere, which a valid graph has not.
    pub(crate) fn best_processor(
        &self,
        task: usize,
        mut score: impl FnMut(usize) -> f64,
    ) -> Option<(usize, f64)> {
        let mut best: Option<(usize, f64)> = None;
        for p in (0..self.graph.num_processors()).filter(|&p| self.graph.can_run(task, p)) {
            let s = score(p);
            match best {
                Some((_, b)) if !clearly_less(s, b) => {}
                _ => best = Some((p, s)),
            }
        }
        best
    }

    /// Places `task` on `p` from `start`; returns the timeline position for [`Plan::unplace`].
    pub(crate) fn place(&mut self, task: usize, p: usize, start: f64) -> usize {
        let finish = start + self.graph.cost(task, p);
        self.processor[task] = Some(p);
        self.start[task] = start;
        self.finish[task] = finish;
        self.timelines[p].add(start, finish)
    }

    /// Undoes the latest [`Plan::place`] of `task`, which returned `at`.
    pub(crate) fn unplace(&mut self, task: usize, at: usize) {
        if let Some(p) = self.processor[task].take() {
            self.timelines[p].remove(at);
        }
    }

    /// The finished schedule (every task must have been placed).
    pub(crate) fn into_schedule(self) -> Schedule {
        let tasks: Vec<Placed> = self
            .graph
            .tasks()
            .iter()
            .enumerate()
            .map(|(i, t)| Placed {
                id: t.id.clone(),
                processor: self.processor[i].unwrap_or(usize::MAX),
                start: self.start[i],
                finish: self.finish[i],
            })
            .collect();
        let makespan = tasks.iter().map(|t| t.finish).fold(0.0, f64::max);
        Schedule { makespan, tasks }
    }
}

/// Runs a list scheduler: repeatedly takes the ready task (all predecessors placed)
/// with the largest key — ties to the earlier topological position — and lets `place`
/// put it on the plan.
pub(crate) fn list_schedule<'g>(
    graph: &'g CostGraph,
    keys: &[u64],
    mut place: impl FnMut(&mut Plan<'g>, usize),
) -> Schedule {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let n = graph.num_tasks();
    let mut plan = Plan::new(graph);
    let mut missing: Vec<usize> = (0..n).map(|t| graph.in_edges(t).len()).collect();
    let mut ready: BinaryHeap<(u64, Reverse<usize>, usize)> = (0..n)
        .filter(|&t| missing[t] == 0)
        .map(|t| (keys[t], Reverse(graph.topological_position(t)), t))
        .collect();
    while let Some((_, _, t)) = ready.pop() {
        place(&mut plan, t);
        for &e in graph.out_edges(t) {
            let to = graph.edges()[e].to;
            missing[to] -= 1;
            if missing[to] == 0 {
                ready.push((keys[to], Reverse(graph.topological_position(to)), to));
            }
        }
    }
    plan.into_schedule()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insertion_finds_the_first_gap_that_fits() {
        let mut t = Timeline::default();
        t.add(0.0, 5.0);
        t.add(10.0, 12.0);
        t.add(20.0, 30.0);
        assert_eq!(t.earliest_start(0.0, 5.0, true), 5.0);
        assert_eq!(t.earliest_start(0.0, 6.0, true), 12.0);
        assert_eq!(t.earliest_start(13.0, 8.0, true), 30.0);
        assert_eq!(t.earliest_start(13.0, 7.0, true), 13.0);
        assert_eq!(t.earliest_start(0.0, 1.0, false), 30.0);
        assert_eq!(t.earliest_start(40.0, 1.0, false), 40.0);
        assert_eq!(t.end(), 30.0);
    }

    #[test]
    fn a_zero_length_task_is_a_point_no_task_may_straddle() {
        let mut t = Timeline::default();
        let at = t.add(4.0, 4.0);
        assert_eq!(t.earliest_start(0.0, 4.0, true), 0.0);
        assert_eq!(t.earliest_start(0.0, 5.0, true), 4.0);
        assert_eq!(t.earliest_start(1.0, 0.0, true), 1.0);
        t.remove(at);
        assert_eq!(t.earliest_start(0.0, 5.0, true), 0.0);
        assert_eq!(t.end(), 0.0);
    }

    #[test]
    fn rank_keys_are_monotone_and_absorb_rounding() {
        let keys = rank_keys(&[80.0, 79.999_999_999_999_99, 77.0, 0.0]);
        assert_eq!(keys[0], keys[1]);
        assert!(keys[2] < keys[1] && keys[3] < keys[2]);
        assert_eq!(rank_keys(&[0.0, 0.0]), vec![0, 0]);
        assert!(clearly_less(1.0, 2.0));
        assert!(!clearly_less(1.0, 1.0 + 1e-15));
        assert!(!clearly_less(2.0, 1.0));
    }
}
