//! The `heft` policy's window: tasks held from submission until the next wait, then
//! placed together by HEFT and dispatched in the order of their planned starts.

use super::record::{schedule_items, Recording};
use super::*;
use crate::sim;

/// Tasks held by `heft`, in submission order.
#[derive(Default)]
pub(super) struct Window {
    held: Vec<(u64, Arc<Pending>)>,
    /// The same tasks as a graph, for planning.
    graph: Option<Recording>,
}

impl Window {
    pub(super) fn len(&self) -> usize {
        self.held.len()
    }
}

impl State {
    /// Holds task `id` until the window is flushed.
    pub(super) fn hold(&mut self, id: u64, pending: Arc<Pending>) {
        let graph = self.window.graph.get_or_insert_with(|| Recording::new(id));
        graph.task(id, &pending);
        self.window.held.push((id, pending));
    }

    /// Plans the held tasks with HEFT and dispatches them in the order of their
    /// planned starts (a topological order: a task starts after its predecessors
    /// finish). A task that cannot start is reported at the next wait, as under the
    /// other policies. If planning fails the tasks go in submission order, placed by
    /// dmda's rule.
    pub(super) fn flush(&mut self, shared: &Shared) {
        let held = std::mem::take(&mut self.window.held);
        let Some(graph) = self.window.graph.take() else {
            return;
        };
        if held.is_empty() {
            return;
        }
        let items = graph.into_items();
        let schedule = schedule_items(shared, self, &items, sim::Policy::Heft).ok();
        let mut order: Vec<usize> = (0..held.len()).collect();
        if let Some(s) = &schedule {
            order.sort_by(|&a, &b| {
                let start = |k: usize| s.tasks.get(k).map_or(f64::INFINITY, |t| t.start);
                start(a).total_cmp(&start(b)).then(a.cmp(&b))
            });
        }
        let now = shared.epoch.elapsed().as_secs_f64();
        for k in order {
            let (id, p) = &held[k];
            if self
                .fails_with_dependency(*id, &p.label, &p.accesses, &p.deps, &p.task.after)
                .is_some()
            {
                continue;
            }
            let alive = |c: &&(usize, usize)| self.devices[c.0].lost.is_none();
            let planned = schedule
                .as_ref()
                .and_then(|s| s.tasks.get(k))
                .and_then(|t| {
                    p.candidates
                        .iter()
                        .filter(alive)
                        .find(|c| c.0 == t.processor)
                });
            let chosen = match planned {
                Some(&c) => c,
                None => {
                    let alive: Vec<(usize, usize)> =
                        p.candidates.iter().filter(alive).copied().collect();
                    let infos: Vec<Candidate> = alive
                        .iter()
                        .map(|&(d, _)| {
                            self.candidate(
                                shared,
                                &p.task.codelet,
                                d,
                                &p.accesses,
                                p.footprint,
                                now,
                            )
                        })
                        .collect();
                    match alive.get(shared.policy.choose(&infos)) {
                        Some(&c) => c,
                        None => p.candidates[0],
                    }
                }
            };
            if let Err(e) = self.start(shared, *id, p, &p.deps, chosen, now) {
                self.errors.push(e);
            }
        }
    }
}
