//! Recovery from failed work: isolating a failure to the tasks that depend on it, and
//! dropping a lost device.
//!
//! A HAL stream that hits an error skips the work queued behind it until the error is
//! reported. The scheduler shares one stream per device among tasks that may have
//! nothing to do with each other, so a failure would otherwise take independent tasks
//! down with it. Every operation the scheduler enqueues is followed by an event (see
//! the `stream` module); when one reports an error, [`State::recover`]:
//!
//! 1. drains every stream and takes its error (the lock keeps new work out), and finds
//!    on each stream the first operation that did not run;
//! 2. classifies the tasks that did not run, in submission order: a task that depends
//!    on a failed task fails, naming it; a task whose device was lost (`DeviceLost` or
//!    `Unavailable`), that waited for work that is to run again, or that the stream
//!    skipped behind an earlier failure runs again; the first task that did not run on
//!    its stream, with all it waited for in place, is the one that failed, with the
//!    stream's error as the cause;
//! 3. rolls every handle back to its state before its first operation that did not
//!    run (`HandleState::repair`), drops the replicas of lost devices, and marks the
//!    handles whose only copy went with them;
//! 4. dispatches the tasks to run again, in submission order, on their device or —
//!    when it was lost — wherever the policy places them.
//!
//! Each failure reaches the caller once, at the next wait; tasks that failed because
//! they depend on it say so when waited for. A task runs at most [`MAX_ATTEMPTS`]
//! times (a hang guard), so a failure that repeats ends as a failure.

use std::collections::BTreeMap;

use super::*;

/// Times a task is dispatched before a failure that keeps it from running is final. A
/// hang guard: a task runs again only when something it waited for did not run, which
/// happens once per failure in flight or lost device, so a task that reaches it meets a
/// failure that repeats every time.
pub(super) const MAX_ATTEMPTS: u32 = 64;

/// What recovery decided for a task that did not run.
enum Verdict {
    /// It failed: by itself (`original`, reported at the next wait) or because of
    /// another task's failure.
    Failed {
        why: String,
        original: bool,
        /// The failure it comes from (itself when original).
        root: String,
    },
    /// It runs again.
    Again,
}

impl State {
    /// Learns how far every stream has got; when an operation failed, recovers (see
    /// the module docs). `taken` holds errors the caller already took from streams
    /// (by synchronizing them), by stream index. Returns whether tasks were dispatched
    /// again.
    pub(super) fn poll_streams(&mut self, shared: &Shared, taken: &mut [Option<Error>]) -> bool {
        let mut failed = false;
        for slot in &mut self.streams {
            failed |= !slot.poll();
        }
        if failed || self.unrecovered_loss || taken.iter().any(Option::is_some) {
            self.unrecovered_loss = false;
            self.recover(shared, taken)
        } else {
            false
        }
    }

    /// See the module docs. Returns whether tasks were dispatched again.
    fn recover(&mut self, shared: &Shared, taken: &mut [Option<Error>]) -> bool {
        let n = self.streams.len();
        // 1. Drain; the first operation that did not run on each stream, and why.
        let mut causes: Vec<Option<Error>> = (0..n).map(|_| None).collect();
        let mut first_bad = vec![u64::MAX; n];
        for s in 0..n {
            // A lost device's streams are not waited for: what they have not finished
            // does not run.
            if self.devices[device_of(s)].lost.is_none() {
                if let Err(e) = self.streams[s].stream.synchronize() {
                    causes[s] = Some(e);
                }
            }
            if let Some(e) = taken.get_mut(s).and_then(Option::take) {
                causes[s].get_or_insert(e);
            }
            let slot = &mut self.streams[s];
            // The stream's report of a failure an earlier recovery handled from its
            // events: the stream keeps only its first error until reported, so this is
            // that one, not a new failure (a new one fails its events again below).
            let reported = causes[s].is_some();
            if slot.error_owed && reported {
                slot.error_owed = false;
                causes[s] = None;
            }
            for (seq, e) in &slot.inflight {
                match e.query() {
                    Ok(true) => slot.completed = *seq,
                    Ok(false) => {
                        first_bad[s] = *seq;
                        break;
                    }
                    Err(err) => {
                        first_bad[s] = *seq;
                        // Failed work without the stream's own report: someone else
                        // took it, and it is still to reach a recovery.
                        if !reported {
                            slot.error_owed = true;
                        }
                        causes[s].get_or_insert(err);
                        break;
                    }
                }
            }
            slot.inflight.clear();
            slot.reset_waits();
        }
        if first_bad.iter().all(|b| *b == u64::MAX) {
            // Only errors of work that was not the scheduler's own to track.
            for e in causes.into_iter().flatten() {
                self.errors.push(e);
            }
            self.settle(shared);
            return false;
        }
        let bad = |p: Point| p.seq >= first_bad[p.stream];

        // Lost devices.
        for d in 0..self.devices.len() {
            if self.devices[d].lost.is_some() {
                continue;
            }
            let lost = [compute_stream(d), copy_stream(d)]
                .into_iter()
                .find_map(|s| {
                    causes[s].as_ref().filter(|e| {
                        matches!(e, Error::DeviceLost { .. } | Error::Unavailable { .. })
                    })
                });
            if let Some(e) = lost {
                self.devices[d].lost = Some(e.to_string());
            }
        }
        // 2. Classify, in submission order.
        let mut errored: Vec<u64> = self
            .live
            .iter()
            .flat_map(|l| l.iter().map(|&(_, id)| id))
            .collect();
        errored.retain(|id| {
            self.tasks
                .get(id)
                .is_some_and(|t| t.failed.is_none() && t.points().any(bad))
        });
        errored.sort_unstable();
        errored.dedup();
        let mut verdicts: BTreeMap<u64, Verdict> = BTreeMap::new();
        // Handles written by tasks that failed here, with the task and why.
        let mut poisoned: HashMap<u64, (u64, String)> = HashMap::default();
        for &id in &errored {
            let Some(rec) = self.tasks.get(&id) else {
                continue;
            };
            let device = device_of(rec.point.stream);
            let here = shared.devices[device].id();
            let cause = |s: usize| {
                causes[s].as_ref().map_or_else(
                    || "an operation before it on its stream did not complete".to_string(),
                    ToString::to_string,
                )
            };
            let (deps, after, accesses): (Vec<u64>, &[TaskId], &[(Handle, AccessMode)]) =
                match &rec.redo {
                    Some(r) => (
                        r.deps
                            .as_ref()
                            .unwrap_or(&r.pending.deps)
                            .iter()
                            .copied()
                            .collect(),
                        &r.pending.task.after,
                        &r.pending.accesses,
                    ),
                    None => (Vec::new(), &[], &rec.collective[..]),
                };
            let failed = |d: u64| match verdicts.get(&d) {
                Some(Verdict::Failed { root, .. }) => Some(root.clone()),
                Some(Verdict::Again) => None,
                None => self
                    .tasks
                    .get(&d)
                    .and_then(|t| t.failed.as_ref())
                    .map(|why| format!("task {d} failed: {why}")),
            };
            let failed_after = after.iter().find_map(|d| failed(d.0).map(|why| (*d, why)));
            let poisoned_read = accesses
                .iter()
                .filter(|(_, m)| m.reads())
                .find_map(|(h, _)| poisoned.get(&h.id).map(|p| (*h, p.clone())));
            let original = |why: String| Verdict::Failed {
                root: format!("task {id} failed: {why}"),
                why,
                original: true,
            };
            let verdict = if let Some((dep, root)) = failed_after {
                Verdict::Failed {
                    why: format!("{} depends on {dep}: {root}", rec.label),
                    original: false,
                    root,
                }
            } else if let Some((h, (_, root))) = poisoned_read {
                Verdict::Failed {
                    why: format!("{} reads {h}, which has no value: {root}", rec.label),
                    original: false,
                    root,
                }
            } else if rec.redo.is_none() {
                let s = rec
                    .points()
                    .find(|p| bad(*p))
                    .map_or(rec.point.stream, |p| p.stream);
                original(format!("{} failed on {here}: {}", rec.label, cause(s)))
            } else if self.devices[device].lost.is_some()
                || deps.iter().any(|d| verdicts.contains_key(d))
                || rec.inputs.iter().any(|p| bad(*p))
                || rec.point.seq != first_bad[rec.point.stream]
            {
                // Its device was lost, or it waited for work that did not run.
                Verdict::Again
            } else {
                original(format!(
                    "{} failed on {here}: {}",
                    rec.label,
                    cause(rec.point.stream)
                ))
            };
            let verdict = match verdict {
                Verdict::Again
                    if rec
                        .redo
                        .as_ref()
                        .is_some_and(|r| r.attempts >= MAX_ATTEMPTS) =>
                {
                    original(format!(
                        "{} did not run in {MAX_ATTEMPTS} attempts; the last time on {here}: {}",
                        rec.label,
                        cause(rec.point.stream)
                    ))
                }
                v => v,
            };
            for (h, m) in accesses.iter().filter(|(_, m)| m.writes()) {
                let _ = m;
                match &verdict {
                    Verdict::Failed { root, .. } => {
                        poisoned.insert(h.id, (id, root.clone()));
                    }
                    Verdict::Again => {
                        poisoned.remove(&h.id);
                    }
                }
            }
            verdicts.insert(id, verdict);
        }
        // 3. Data.
        let lost: Vec<usize> = (0..self.devices.len())
            .filter(|d| self.devices[*d].lost.is_some())
            .collect();
        for hs in self.handles.values_mut() {
            hs.repair(bad);
            for &d in &lost {
                if hs.drop_replica(d) {
                    hs.gone = Some(format!(
                        "its only valid copy was on {}, which was lost",
                        shared.devices[d].id()
                    ));
                }
            }
        }
        for &d in &lost {
            self.replica_bytes[d] = 0;
        }
        // The tasks that did not run leave the device lists; the failed ones stay
        // recorded (their dependants must learn of them) and release what waits for
        // them.
        let errored: BTreeSet<u64> = verdicts.keys().copied().collect();
        for live in &mut self.live {
            live.retain(|(_, id)| !errored.contains(id));
        }
        self.settle(shared);
        // 4. In submission order: failures recorded, the rest dispatched again (so
        // that what a task reads has no value only if an earlier task took it).
        let mut dispatched = false;
        let now = shared.epoch.elapsed().as_secs_f64();
        for (id, verdict) in verdicts {
            let redo = match verdict {
                Verdict::Failed {
                    why,
                    original,
                    root,
                } => {
                    let Some(rec) = self.tasks.get_mut(&id) else {
                        continue;
                    };
                    rec.failed = Some(why.clone());
                    let redo = rec.redo.take();
                    // The tasks after it wait for its dependencies in its place (some
                    // of them run again, at new points).
                    rec.through = redo
                        .as_ref()
                        .map(|r| {
                            r.deps
                                .as_ref()
                                .unwrap_or(&r.pending.deps)
                                .iter()
                                .copied()
                                .collect()
                        })
                        .unwrap_or_default();
                    let accesses = match redo {
                        Some(r) => r.pending.accesses.clone(),
                        None => rec.collective.clone(),
                    };
                    self.poison(&accesses, id, root);
                    if original {
                        self.errors
                            .push(Error::aborted(format!("task {id}: {why}")));
                    }
                    self.release(id, 0);
                    continue;
                }
                Verdict::Again => match self.tasks.remove(&id).and_then(|r| r.redo) {
                    Some(redo) => redo,
                    None => continue,
                },
            };
            dispatched = true;
            self.again(shared, id, &redo, now);
        }
        dispatched
    }

    /// Dispatches task `id` again (see [`State::recover`]).
    fn again(&mut self, shared: &Shared, id: u64, redo: &Redo, now: f64) {
        let p = &redo.pending;
        let deps = redo.deps.as_ref().unwrap_or(&p.deps);
        self.stats.retried += 1;
        if self
            .fails_with_dependency(id, &p.label, &p.accesses, deps, &p.task.after)
            .is_some()
        {
            self.release(id, 0);
            return;
        }
        let alive: Vec<(usize, usize)> = p
            .candidates
            .iter()
            .copied()
            .filter(|c| self.devices[c.0].lost.is_none())
            .collect();
        let Some(&first) = alive.first() else {
            let why = format!(
                "{} can run on none of the devices left: {}",
                p.label,
                self.lost_devices(shared)
            );
            self.fail_task(id, &p.label, &p.accesses, deps, why.clone());
            self.errors.push(Error::unavailable("scheduler", why));
            return;
        };
        let chosen = if alive.len() == 1 {
            first
        } else {
            let infos: Vec<Candidate> = alive
                .iter()
                .map(|&(d, _)| {
                    self.candidate(shared, &p.task.codelet, d, &p.accesses, p.footprint, now)
                })
                .collect();
            alive[shared.policy.choose(&infos)]
        };
        match self.start(shared, id, p, deps, chosen, now) {
            Ok(()) => {
                if let Some(r) = self.tasks.get_mut(&id).and_then(|t| t.redo.as_mut()) {
                    r.attempts = redo.attempts + 1;
                }
            }
            Err(e) => {
                let why = self
                    .tasks
                    .get(&id)
                    .and_then(|t| t.failed.clone())
                    .unwrap_or_else(|| e.to_string());
                self.errors
                    .push(Error::aborted(format!("task {id}: {why}")));
                self.release(id, 0);
            }
        }
    }

    /// After every stream was drained: everything enqueued so far has run (or will not).
    fn settle(&mut self, shared: &Shared) {
        for slot in &mut self.streams {
            slot.completed = slot.seq;
        }
        let now = shared.epoch.elapsed().as_secs_f64();
        for dev in &mut self.devices {
            dev.busy_until = dev.busy_until.min(now);
        }
    }

    /// Marks the handles failed task `id` writes as having no value, because of
    /// `root`.
    pub(super) fn poison(&mut self, accesses: &[(Handle, AccessMode)], id: u64, root: String) {
        for (h, m) in accesses {
            if m.writes() {
                if let Some(hs) = self.handles.get_mut(&h.id) {
                    hs.failed_write(id, root.clone());
                }
            }
        }
    }

    /// The lost devices and why, for messages.
    pub(super) fn lost_devices(&self, shared: &Shared) -> String {
        let lost: Vec<String> = self
            .devices
            .iter()
            .enumerate()
            .filter_map(|(d, s)| {
                s.lost
                    .as_ref()
                    .map(|why| format!("{} was lost ({why})", shared.devices[d].id()))
            })
            .collect();
        if lost.is_empty() {
            "no device was lost".to_string()
        } else {
            lost.join("; ")
        }
    }
}
