//! Placement bookkeeping and dispatch: what the policy sees, and enqueuing a task.

use super::*;

impl State {
    /// Learns how far devices have got (recovering from failed work, see the
    /// `recovery` module) and collects finished timings. Returns how many queued tasks
    /// became ready because the tasks they waited for have run.
    pub(super) fn poll(&mut self, shared: &Shared) -> usize {
        let mut taken = Vec::new();
        self.poll_taken(shared, &mut taken)
    }

    /// [`State::poll`], with errors the caller already took from streams, by stream.
    pub(super) fn poll_taken(&mut self, shared: &Shared, taken: &mut [Option<Error>]) -> usize {
        let mut released = 0;
        self.poll_streams(shared, taken);
        // Each stream's timings complete in the order they were enqueued: only those
        // at the front can have completed since the last poll.
        let mut measurements = std::mem::take(&mut self.measurements);
        for queue in &mut measurements {
            while let Some(m) = queue.front() {
                match m.end.query() {
                    Ok(true) => {
                        if let Ok(t) = m.end.elapsed_since(&m.start) {
                            self.learn(&m.what, t.as_secs_f64());
                        }
                    }
                    Ok(false) => break,
                    Err(_) => {}
                }
                queue.pop_front();
            }
        }
        self.measurements = measurements;
        // Forget tasks every device has passed, oldest first (failed ones stay:
        // dependants must learn of the failure).
        for s in 0..self.live.len() {
            let (completed, d) = (self.streams[s].completed, device_of(s));
            while let Some(&(seq, id)) = self.live[s].front() {
                if seq > completed {
                    break;
                }
                self.live[s].pop_front();
                let done = self.tasks.get(&id).is_some_and(|t| {
                    t.failed.is_none()
                        && t.points()
                            .all(|p| p.seq <= self.streams.get(p.stream).map_or(0, |x| x.completed))
                });
                if done {
                    self.tasks.remove(&id);
                    if !self.runs.is_empty() {
                        self.runs.remove(&id);
                    }
                    released += self.release(id, d);
                }
            }
        }
        let _ = shared;
        released
    }

    /// Learns from one completed timing: `t` seconds of `what`.
    fn learn(&mut self, what: &Timed, t: f64) {
        match what {
            Timed::Task {
                codelet,
                arch,
                footprint,
            } => self.models.record(codelet, arch, *footprint, t),
            Timed::Copy { device, bytes } if t > 0.0 => {
                let measured = *bytes as f64 / t;
                let bw = &mut self.devices[*device].bandwidth;
                // A running average that follows changes within a few copies.
                *bw = Some(bw.map_or(measured, |b| 0.75 * b + 0.25 * measured));
            }
            Timed::Copy { .. } => {}
        }
    }

    /// The id that task `id` is recorded under: its own, or — for an item of a replayed
    /// run — the run's.
    pub(super) fn resolve(&self, id: u64) -> u64 {
        if self.runs.is_empty() {
            return id;
        }
        match self.runs.range(..=id).next_back() {
            Some((&first, &last)) if id <= last => first,
            _ => id,
        }
    }

    /// Records task `id`'s access to handle `h` as `mode`, adding the tasks it must wait
    /// for to `deps`. A handle read by many tasks forgets the finished ones now and then,
    /// so its state stays small.
    pub(super) fn access(
        &mut self,
        h: u64,
        id: u64,
        mode: AccessMode,
        key: u64,
        deps: &mut BTreeSet<u64>,
    ) {
        let (tasks, pending) = (&self.tasks, &self.queues.pending);
        if let Some(hs) = self.handles.get_mut(&h) {
            if hs.deps.len() > PRUNE_ABOVE {
                hs.deps
                    .prune(|t| !tasks.contains_key(&t) && !pending.contains_key(&t));
            }
            hs.deps.access_keyed(id, mode, key, deps);
        }
    }

    /// What the policy sees of device `d` for a task.
    pub(super) fn candidate(
        &mut self,
        shared: &Shared,
        codelet: &Codelet,
        d: usize,
        accesses: &[(Handle, AccessMode)],
        footprint: u64,
        now: f64,
    ) -> Candidate {
        let arch = &shared.archs[d];
        let (exec, samples) = self.models.estimate_for(codelet, arch, footprint);
        let bandwidth = self.devices[d].bandwidth.unwrap_or(DEFAULT_BANDWIDTH);
        let transfer: f64 = accesses
            .iter()
            .filter(|(_, m)| m.reads())
            .filter_map(|(h, _)| self.handles.get(&h.id))
            .filter(|hs| !hs.replicas[d].as_ref().is_some_and(|r| r.valid))
            .map(|hs| HANDOFF + hs.handle.len as f64 / bandwidth)
            .sum();
        let inputs_in = (self.inputs_ready(accesses) - now).max(0.0);
        let dev = &self.devices[d];
        let queued = self.streams[compute_stream(d)].outstanding();
        Candidate {
            inputs_in,
            device: d,
            queued,
            free_in: (dev.busy_until - now).max(0.0),
            exec,
            samples,
            transfer,
        }
    }

    /// The points a task with dependencies `deps` waits for: where each ends, and for
    /// a dependency that failed without running, where its own dependencies end.
    pub(super) fn dep_points(&self, deps: &BTreeSet<u64>) -> Vec<Point> {
        let mut points = Vec::with_capacity(deps.len());
        self.dep_points_into(deps, &mut points);
        points
    }

    /// [`State::dep_points`], appended to `points`.
    pub(super) fn dep_points_into(&self, deps: &BTreeSet<u64>, points: &mut impl Extend<Point>) {
        // Tasks that failed without running lead on to their own dependencies (rare:
        // the set of those seen is made only then).
        let mut todo = Vec::new();
        for t in deps {
            if let Some(rec) = self.tasks.get(t) {
                points.extend(rec.points().filter(|p| p.seq > 0));
                todo.extend(rec.through.iter().copied());
            }
        }
        if todo.is_empty() {
            return;
        }
        let mut seen: rustc_hash::FxHashSet<u64> = deps.iter().copied().collect();
        while let Some(t) = todo.pop() {
            if !seen.insert(t) {
                continue;
            }
            if let Some(rec) = self.tasks.get(&t) {
                points.extend(rec.points().filter(|p| p.seq > 0));
                todo.extend(rec.through.iter().copied());
            }
        }
    }

    /// When the last of the handles the task reads is expected to be written (seconds
    /// since the scheduler's epoch, predicted).
    pub(super) fn inputs_ready(&self, accesses: &[(Handle, AccessMode)]) -> f64 {
        accesses
            .iter()
            .filter(|(_, m)| m.reads())
            .filter_map(|(h, _)| self.handles.get(&h.id))
            .map(|hs| hs.written_by)
            .fold(0.0, f64::max)
    }

    /// Records a task that could not run, so that its dependants fail too.
    pub(super) fn fail_task(
        &mut self,
        id: u64,
        label: &Arc<str>,
        accesses: &[(Handle, AccessMode)],
        deps: &BTreeSet<u64>,
        message: String,
    ) {
        let root = format!("task {id} failed: {message}");
        self.fail_task_from(id, label, accesses, deps, message, root);
    }

    /// Records a task that could not run; what it writes has no value because of
    /// `root` (the failure it comes from, said once however long the chain).
    pub(super) fn fail_task_from(
        &mut self,
        id: u64,
        label: &Arc<str>,
        accesses: &[(Handle, AccessMode)],
        deps: &BTreeSet<u64>,
        message: String,
        root: String,
    ) {
        self.poison(accesses, id, root);
        // It never runs, but the tasks after it must still follow what it followed (a
        // write after it may be ordered after the readers before it only through it):
        // they wait for its dependencies instead (`State::dep_points`).
        self.tasks.insert(
            id,
            TaskRecord {
                label: label.clone(),
                point: Point { stream: 0, seq: 0 },
                through: deps.iter().copied().collect(),
                extra: Vec::new(),
                failed: Some(message),
                inputs: Points::new(),
                redo: None,
                collective: Vec::new(),
            },
        );
        // Its dependants will not wait for it: they fail when they are dispatched.
        self.release(id, 0);
    }

    /// Failures follow the data: if task `id` reads a handle that has no value (the
    /// task that last wrote it failed, or its only copy was lost), or one of the tasks it
    /// was explicitly ordered `after` failed, records it as failed too and returns the
    /// error that says why. (A task that only had to wait for a failed one — it
    /// overwrites what that one read or wrote — runs.)
    pub(super) fn fails_with_dependency(
        &mut self,
        id: u64,
        label: &Arc<str>,
        accesses: &[(Handle, AccessMode)],
        deps: &BTreeSet<u64>,
        after: &[TaskId],
    ) -> Option<Error> {
        let (message, root) = after
            .iter()
            .find_map(|d| {
                self.tasks
                    .get(&self.resolve(d.0))
                    .and_then(|t| t.failed.as_ref())
                    .map(|why| {
                        (
                            format!("{label} depends on {d}, which failed: {why}"),
                            format!("{d} failed: {why}"),
                        )
                    })
            })
            .or_else(|| {
                accesses
                    .iter()
                    .filter(|(_, m)| m.reads())
                    .find_map(|(h, _)| {
                        let hs = self.handles.get(&h.id)?;
                        let why = hs.value_lost(id)?;
                        Some((
                            format!("{label} reads {h}, which has no value: {why}"),
                            why.to_string(),
                        ))
                    })
            })?;
        self.fail_task_from(id, label, accesses, deps, message.clone(), root);
        Some(Error::aborted(message))
    }

    /// Dispatches task `id` on `chosen`, or — when that device's memory cannot hold the
    /// task's data even after eviction — on the next candidates in turn. A task that
    /// cannot start anywhere is recorded as failed (its dependants fail too).
    pub(super) fn start(
        &mut self,
        shared: &Shared,
        id: u64,
        p: &Arc<Pending>,
        deps: &BTreeSet<u64>,
        chosen: (usize, usize),
        now: f64,
    ) -> Result<()> {
        let mut last = None;
        // The chosen device, then the other candidates not lost, in turn (found as
        // needed: most tasks start on the first).
        let mut fallbacks = 0;
        let mut current = Some(chosen);
        while let Some((d, implementation)) = current {
            match self.dispatch(
                shared,
                &p.task,
                p.run.as_deref(),
                id,
                &p.label,
                d,
                implementation,
                &p.accesses,
                deps,
                p.footprint,
                now,
            ) {
                Ok(()) => {
                    if let Some(rec) = &mut self.recording {
                        rec.placed(id, d, implementation);
                    }
                    if let Some(t) = self.tasks.get_mut(&id) {
                        t.redo = Some(Redo {
                            pending: p.clone(),
                            deps: (!std::ptr::eq(deps, &p.deps)).then(|| deps.clone()),
                            attempts: 1,
                        });
                    }
                    return Ok(());
                }
                Err(e @ Error::OutOfMemory { .. }) => last = Some((d, e)),
                // The device is gone (now, or already: a worker may have taken the task
                // before the loss was known): the task goes to the next candidate, and
                // the next poll recovers what the device had in flight.
                Err(e @ (Error::DeviceLost { .. } | Error::Unavailable { .. })) => {
                    if self.devices[d].lost.is_none() {
                        self.devices[d].lost = Some(e.to_string());
                        self.unrecovered_loss = true;
                    }
                    last = Some((d, e));
                }
                Err(e) => {
                    last = Some((d, e));
                    break;
                }
            }
            current = None;
            while let Some(&c) = p.candidates.get(fallbacks) {
                fallbacks += 1;
                if c != chosen && self.devices[c.0].lost.is_none() {
                    current = Some(c);
                    break;
                }
            }
        }
        let (d, e) = last.unwrap_or((
            chosen.0,
            Error::invalid(format!("{}: no device to run on", p.label)),
        ));
        let message = format!(
            "{} could not be started on {}: {e}",
            p.label,
            shared.devices[d].id()
        );
        self.fail_task(id, &p.label, &p.accesses, deps, message);
        Err(e)
    }

    /// Enqueues task `id` on device `d` (for a replayed run, its items in order).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dispatch(
        &mut self,
        shared: &Shared,
        task: &Task,
        run: Option<&record::Run>,
        id: u64,
        label: &Arc<str>,
        d: usize,
        implementation: usize,
        accesses: &[(Handle, AccessMode)],
        deps: &BTreeSet<u64>,
        footprint: u64,
        now: f64,
    ) -> Result<()> {
        let s = compute_stream(d);
        if let Some(why) = &self.devices[d].lost {
            return Err(Error::unavailable(
                "scheduler",
                format!("{} was lost: {why}", shared.devices[d].id()),
            ));
        }
        // Data: a replica of every handle on the device, valid for those it reads.
        let mut memories: SmallVec<[Allocation; 4]> = SmallVec::new();
        let mut inputs = Points::new();
        for (h, m) in accesses {
            if m.reads() {
                if let Some(why) = self.handles.get(&h.id).and_then(|hs| hs.value_lost(id)) {
                    return Err(Error::aborted(format!(
                        "{label} reads {h}, which has no value: {why}"
                    )));
                }
            }
            let memory = self.replica(shared, *h, d)?;
            if m.reads() {
                if let Some(p) = self.fetch(shared, *h, d, &memory)? {
                    wait_for(&mut self.streams, s, p)?;
                    inputs.push(p);
                }
            }
            memories.push(memory);
        }
        // Dependencies on other streams (the task record keeps them with the fetches).
        let fetched = inputs.len();
        self.dep_points_into(deps, &mut inputs);
        for &p in &inputs[fetched..] {
            wait_for(&mut self.streams, s, p)?;
        }
        // Timing, while the model learns (and now and then after).
        let arch = &shared.archs[d];
        let profiled = self
            .profiling
            .as_ref()
            .is_some_and(|p| p.origins.get(d).is_some_and(Option::is_some));
        let timed = profiled
            || shared.devices[d].capabilities().event_timing && {
                // While the model learns, until enough timings are under way: when
                // submission runs far ahead of execution, the samples arrive late.
                let samples = self.models.samples_at(&task.codelet, arch, footprint);
                let under_way = self.measurements[s].len() as u64;
                self.time_every
                    || (samples < CALIBRATION_SAMPLES && under_way < TIMINGS_UNDER_WAY)
                    || id.is_multiple_of(SAMPLE_EVERY)
            };
        let start = if timed {
            Some(self.streams[s].stream.record_event()?)
        } else {
            None
        };
        // The work.
        let stream = &self.streams[s].stream;
        let device = &shared.devices[d];
        match run {
            None => {
                let mut batch = stream.batch();
                enqueue(
                    &mut batch,
                    device,
                    task,
                    label,
                    accesses,
                    implementation,
                    &memories,
                )?;
                batch.submit()?;
            }
            Some(run) => {
                // Validated and kept the first time on this device; then only bound to
                // the replicas of the time and enqueued as one submission.
                let m: Vec<&Allocation> = memories.iter().collect();
                let kept = match run.kept_on(d) {
                    Some(kept) => kept,
                    None => {
                        let mut batch = stream.batch();
                        let mut args: Vec<&Allocation> = Vec::new();
                        for item in &run.items {
                            let p = &item.pending;
                            let Some(&(_, i)) = p.candidates.iter().find(|c| c.0 == d) else {
                                return Err(Error::unsupported(format!(
                                    "{}: {} has no implementation of {}",
                                    label,
                                    device.id(),
                                    p.label
                                )));
                            };
                            args.clear();
                            args.extend(item.slots.iter().map(|&k| m[k as usize]));
                            enqueue(&mut batch, device, &p.task, &p.label, &p.accesses, i, &args)?;
                        }
                        let kept = batch.keep(&m)?;
                        run.keep(d, kept.clone());
                        kept
                    }
                };
                stream.submit_kept(&kept, &m)?;
            }
        }
        let point = self.streams[s].advance(s)?;
        if let Some(start) = start {
            let Some(end) = self.streams[s].event_after(point.seq) else {
                return Err(Error::backend_message(
                    "scheduler",
                    "internal error: no event after a task",
                ));
            };
            if let (true, Some(p)) = (profiled, &mut self.profiling) {
                p.spans.push(PendingSpan {
                    kind: SpanKind::Task,
                    name: label.to_string(),
                    task: Some(id),
                    device: d,
                    stream: 0,
                    bytes: footprint,
                    deps: deps.iter().copied().collect(),
                    start: start.clone(),
                    end: end.clone(),
                });
            }
            self.measurements[s].push_back(Measurement {
                what: Timed::Task {
                    codelet: task.codelet.name().to_string(),
                    arch: arch.clone(),
                    footprint,
                },
                start,
                end,
            });
        }
        // The data it wrote is valid there only.
        let streams = &self.streams;
        for (h, m) in accesses {
            if m.writes() {
                if let Some(hs) = self.handles.get_mut(&h.id) {
                    hs.journal(point, Change::Write, |p| {
                        p.seq <= streams[p.stream].completed
                    });
                    hs.written(d, point, *m == AccessMode::Write, id);
                }
            }
        }
        // Bookkeeping for placement.
        let predicted = self
            .models
            .predict_for(&task.codelet, arch, footprint)
            .unwrap_or(0.0);
        // It starts when the device is free and its inputs are written.
        let inputs_ready = self.inputs_ready(accesses);
        let dev = &mut self.devices[d];
        dev.busy_until = dev.busy_until.max(now).max(inputs_ready) + predicted;
        let done = dev.busy_until;
        for (h, m) in accesses {
            if m.writes() {
                if let Some(hs) = self.handles.get_mut(&h.id) {
                    hs.written_by = done;
                }
            }
        }
        self.tasks.insert(
            id,
            TaskRecord {
                label: label.clone(),
                point,
                extra: Vec::new(),
                failed: None,
                inputs,
                through: Vec::new(),
                redo: None,
                collective: Vec::new(),
            },
        );
        self.stats.placed[d] += run.map_or(1, |r| r.items.len() as u64);
        self.live[s].push_back((point.seq, id));
        Ok(())
    }
}

/// Kernel arguments a launch passes from the stack (more go through a list).
const FEW_ARGS: usize = 8;

/// Adds implementation `implementation` of `task` (labelled `label`, with its merged
/// `accesses`) on `device` to `stream`, over `memories` (one per access).
fn enqueue<A: std::borrow::Borrow<Allocation>>(
    stream: &mut xpu_hal::Batch<'_>,
    device: &Device,
    task: &Task,
    label: &str,
    accesses: &[(Handle, AccessMode)],
    implementation: usize,
    memories: &[A],
) -> Result<()> {
    let m = |k: usize| memories[k].borrow();
    match task.codelet.implementations().get(implementation) {
        Some(Implementation::Builtin(op)) => match *op {
            Builtin::Fill { value } => stream.fill(m(0), value),
            Builtin::Binary { op, dtype } => stream.binary(op, dtype, m(0), m(1), m(2)),
            Builtin::Accumulate { op, dtype } => stream.accumulate(op, dtype, m(0), m(1)),
            Builtin::Scale { alpha } => stream.scale(m(0), m(1), alpha),
            Builtin::Cast { from, to } => stream.cast(m(0), from, m(1), to),
        },
        Some(Implementation::Op(op)) => {
            let op = op.by_ref().try_map(|_, _, slot| {
                Ok::<_, Error>(xpu_hal::ops::Tensor {
                    allocation: m(slot.handle),
                    offset: slot.offset,
                    layout: slot.layout,
                })
            })?;
            stream.run_op(&op)
        }
        Some(Implementation::Kernel { dims, .. }) => {
            let kernel = task
                .codelet
                .kernel(device, implementation)?
                .ok_or_else(|| Error::invalid(format!("{label}: no kernel")))?;
            // The sizes on the stack for the usual few handles.
            let mut few = [0u64; 8];
            let many: Vec<u64>;
            let sizes: &[u64] = if accesses.len() <= few.len() {
                for (s, (h, _)) in few.iter_mut().zip(accesses) {
                    *s = h.len;
                }
                &few[..accesses.len()]
            } else {
                many = accesses.iter().map(|(h, _)| h.len).collect();
                &many
            };
            // The arguments on the stack too, for the usual few.
            let all = memories
                .iter()
                .map(|a| KernelArg::Buffer(a.borrow().whole()))
                .chain(task.scalars.iter().map(|v| KernelArg::Scalar(*v)));
            let n = memories.len() + task.scalars.len();
            if n <= FEW_ARGS {
                let mut few: [KernelArg<'_>; FEW_ARGS] =
                    std::array::from_fn(|_| KernelArg::Scalar(xpu_hal::Scalar::U8(0)));
                for (slot, arg) in few.iter_mut().zip(all) {
                    *slot = arg;
                }
                stream.launch(&kernel, dims(sizes), &few[..n])
            } else {
                let args: Vec<KernelArg<'_>> = all.collect();
                stream.launch(&kernel, dims(sizes), &args)
            }
        }
        None => Err(Error::invalid(format!(
            "{label}: implementation {implementation} of `{}` does not exist",
            task.codelet.name()
        ))),
    }
}
