//! The queued policies (`eager`, `ws`): ready tasks wait in queues, and a worker thread
//! per device takes them while its device has room.

use super::*;

/// A device's worker under a queued policy: takes ready tasks it can run while the
/// device has room, until shut down with the queues empty.
pub(super) fn worker(shared: &Shared, d: usize) {
    let mut st = shared.state.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if st.poll(shared) > 0 {
            shared.work.notify_all();
        }
        let room = st.outstanding(d) < DEPTH;
        if room {
            if let Some(id) = st.pop_ready(shared.policy, d) {
                st.start_pending(shared, id, d);
                shared.work.notify_all();
                continue;
            }
        }
        if st.shutdown && st.queues.pending.is_empty() {
            break;
        }
        if st.outstanding(d) == 0 {
            st = match shared.work.wait_timeout(st, WORKER_NAP) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        } else {
            // Busy: the next thing to happen here is its oldest task finishing, which
            // may release tasks (here or elsewhere); wait for that.
            let oldest = st.streams[compute_stream(d)]
                .inflight
                .front()
                .map(|(_, e)| e.clone());
            drop(st);
            match oldest {
                Some(e) => {
                    let _ = e.wait_timeout(WORKER_NAP);
                }
                None => std::thread::sleep(WORKER_NAP),
            }
            st = shared.state.lock().unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl State {
    /// Tasks enqueued on device `d`'s task stream and not known to have finished.
    pub(super) fn outstanding(&self, d: usize) -> u64 {
        self.streams[compute_stream(d)].outstanding()
    }

    /// Queues task `id` (queued policies): ready at once if everything it depends on
    /// has been dispatched, else when the last of those is.
    pub(super) fn enqueue(&mut self, devices: usize, mut pending: Pending, id: u64) {
        // Ready once everything it depends on has run: a device that takes it then has
        // its inputs, instead of waiting on another device's work.
        let mut remaining = 0;
        for dep in &pending.deps {
            let running = self.queues.pending.contains_key(dep)
                || self.tasks.get(dep).is_some_and(|t| t.failed.is_none());
            if running {
                remaining += 1;
                self.queues.successors.entry(*dep).or_default().push(id);
            }
        }
        pending.remaining = remaining;
        let first = pending.candidates.first().map_or(0, |c| c.0);
        let can = pending.candidates.iter().map(|c| c.0).collect::<Vec<_>>();
        self.queues.pending.insert(id, pending);
        if remaining == 0 {
            // A submission has no device of its own: spread over the candidates.
            let start = self.queues.next;
            self.queues.next = (start + 1) % devices.max(1);
            let home = (0..devices)
                .map(|k| (start + k) % devices)
                .find(|d| can.contains(d))
                .unwrap_or(first);
            self.make_ready(id, home);
        }
    }

    /// Puts a ready task in the queue its policy uses (`near`: the device whose work
    /// made it ready, for `ws`).
    pub(super) fn make_ready(&mut self, id: u64, near: usize) {
        if !self.ws {
            self.queues.central.push_back(id);
            return;
        }
        let runs_near = self
            .queues
            .pending
            .get(&id)
            .is_some_and(|p| p.candidates.iter().any(|c| c.0 == near));
        let at = if runs_near {
            near
        } else {
            self.queues
                .pending
                .get(&id)
                .and_then(|p| p.candidates.first())
                .map_or(near, |c| c.0)
        };
        if let Some(q) = self.queues.local.get_mut(at) {
            q.push_back(id);
        }
    }

    /// The next ready task device `d` takes under `policy`, removed from the queues.
    pub(super) fn pop_ready(&mut self, policy: Policy, d: usize) -> Option<u64> {
        // A device that is already busy leaves a task to an idle device that can run
        // it: taking a second task ahead of time only pays when nobody else could start
        // it sooner.
        let busy = self.outstanding(d) > 0;
        let idle: Vec<bool> = (0..self.devices.len())
            .map(|e| e != d && self.outstanding(e) == 0)
            .collect();
        let runs = |q: &Queues, id: &u64| {
            q.pending.get(id).is_some_and(|p| {
                p.candidates.iter().any(|c| c.0 == d)
                    && !(busy && p.candidates.iter().any(|c| idle[c.0]))
            })
        };
        let id = match policy {
            Policy::Ws => {
                // Its own newest first, then the oldest of the most loaded other deque.
                let own = self.queues.local[d]
                    .iter()
                    .rposition(|id| runs(&self.queues, id))
                    .and_then(|i| self.queues.local[d].remove(i));
                own.or_else(|| {
                    let mut victims: Vec<usize> = (0..self.queues.local.len())
                        .filter(|&v| v != d && !self.queues.local[v].is_empty())
                        .collect();
                    victims.sort_by_key(|&v| std::cmp::Reverse(self.queues.local[v].len()));
                    victims.into_iter().find_map(|v| {
                        let i = self.queues.local[v]
                            .iter()
                            .position(|id| runs(&self.queues, id))?;
                        self.queues.local[v].remove(i)
                    })
                })?
            }
            _ => {
                let i = self
                    .queues
                    .central
                    .iter()
                    .position(|id| runs(&self.queues, id))?;
                self.queues.central.remove(i)?
            }
        };
        Some(id)
    }

    /// Dispatches queued task `id` on device `d` and releases what waited for it.
    pub(super) fn start_pending(&mut self, shared: &Shared, id: u64, d: usize) {
        let Some(pending) = self.queues.pending.remove(&id) else {
            return;
        };
        let pending = Arc::new(pending);
        let chosen = pending
            .candidates
            .iter()
            .copied()
            .find(|c| c.0 == d)
            .unwrap_or((d, 0));
        // A dependant of a failed task: waiting for it says so; the failure itself is
        // reported once.
        if self
            .fails_with_dependency(
                id,
                &pending.label,
                &pending.accesses,
                &pending.deps,
                &pending.task.after,
            )
            .is_some()
        {
            return;
        }
        let now = shared.epoch.elapsed().as_secs_f64();
        if let Err(e) = self.start(shared, id, &pending, &pending.deps, chosen, now) {
            // Reported at the next wait.
            self.errors.push(e);
        }
    }

    /// Task `id` has run (or failed): the tasks waiting for it that now wait for nothing
    /// become ready, near device `near`. Returns how many did.
    pub(super) fn release(&mut self, id: u64, near: usize) -> usize {
        let mut released = 0;
        for s in self.queues.successors.remove(&id).unwrap_or_default() {
            let ready = match self.queues.pending.get_mut(&s) {
                Some(p) => {
                    p.remaining = p.remaining.saturating_sub(1);
                    p.remaining == 0
                }
                None => false,
            };
            if ready {
                self.make_ready(s, near);
                released += 1;
            }
        }
        released
    }
}
