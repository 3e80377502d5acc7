//! Placement bookkeeping and dispatch: what the policy sees, and enqueuing a task.

use super::*;

impl State {
    /// Learns how far devices have got and collects finished timings.
    /// Returns how many queued tasks became ready because the tasks they waited for have
    /// run.
    pub(super) fn poll(&mut self, shared: &Shared) -> usize {
        let mut released = 0;
        for d in 0..self.devices.len() {
            while let Some((seq, e)) = self.devices[d].markers.front() {
                match e.query() {
                    Ok(true) => {
                        let seq = *seq;
                        self.devices[d].completed = seq;
                        self.devices[d].markers.pop_front();
                    }
                    Ok(false) => break,
                    Err(err) => {
                        self.errors.push(err);
                        self.devices[d].markers.pop_front();
                    }
                }
            }
        }
        let mut pending = Vec::new();
        for m in std::mem::take(&mut self.measurements) {
            match m.end.query() {
                Ok(true) => {
                    let Ok(t) = m.end.elapsed_since(&m.start) else {
                        continue;
                    };
                    let t = t.as_secs_f64();
                    match m.what {
                        Timed::Task {
                            codelet,
                            arch,
                            footprint,
                        } => self.models.record(&codelet, &arch, footprint, t),
                        Timed::Copy { device, bytes } if t > 0.0 => {
                            let measured = bytes as f64 / t;
                            let bw = &mut self.devices[device].bandwidth;
                            // A running average that follows changes within a few copies.
                            *bw = Some(bw.map_or(measured, |b| 0.75 * b + 0.25 * measured));
                        }
                        Timed::Copy { .. } => {}
                    }
                }
                Ok(false) => pending.push(m),
                Err(_) => {}
            }
        }
        self.measurements = pending;
        // Forget tasks every device has passed, oldest first (failed ones stay:
        // dependants must learn of the failure).
        for d in 0..self.devices.len() {
            let completed = self.devices[d].completed;
            while let Some(&(seq, id)) = self.live[d].front() {
                if seq > completed {
                    break;
                }
                self.live[d].pop_front();
                let done = self.tasks.get(&id).is_some_and(|t| {
                    t.failed.is_none()
                        && t.points().all(|p| {
                            p.seq <= self.devices.get(p.stream / 2).map_or(0, |x| x.completed)
                        })
                });
                if done {
                    self.tasks.remove(&id);
                    released += self.release(id, d);
                }
            }
        }
        let _ = shared;
        released
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
        let exec = self.models.predict(codelet.name(), arch, footprint);
        let samples = self.models.samples(codelet.name(), arch);
        let bandwidth = self.devices[d].bandwidth.unwrap_or(DEFAULT_BANDWIDTH);
        let transfer: f64 = accesses
            .iter()
            .filter(|(_, m)| m.reads())
            .filter_map(|(h, _)| self.handles.get(&h.id))
            .filter(|hs| !hs.replicas[d].as_ref().is_some_and(|r| r.valid))
            .map(|hs| HANDOFF + hs.handle.len as f64 / bandwidth)
            .sum();
        let dev = &self.devices[d];
        let queued = self.streams[compute_stream(d)]
            .seq
            .saturating_sub(dev.completed);
        Candidate {
            device: d,
            queued,
            free_in: (dev.busy_until - now).max(0.0),
            exec,
            samples,
            transfer,
        }
    }

    /// Records a task that could not run, so that its dependants fail too.
    pub(super) fn fail_task(
        &mut self,
        id: u64,
        label: &str,
        accesses: &[(Handle, AccessMode)],
        message: String,
    ) {
        let _ = accesses;
        self.tasks.insert(
            id,
            TaskRecord {
                label: label.to_string(),
                point: Point { stream: 0, seq: 0 },
                extra: Vec::new(),
                failed: Some(message),
            },
        );
        // Its dependants will not wait for it: they fail when they are dispatched.
        self.release(id, 0);
    }

    /// If one of `deps` failed, records task `id` as failed too and returns the error
    /// that says so, naming the failed task and its cause.
    pub(super) fn fails_with_dependency(
        &mut self,
        id: u64,
        label: &str,
        accesses: &[(Handle, AccessMode)],
        deps: &BTreeSet<u64>,
    ) -> Option<Error> {
        let (dep, why) = deps.iter().find_map(|d| {
            self.tasks
                .get(d)
                .and_then(|t| t.failed.clone().map(|f| (*d, f)))
        })?;
        let message = format!("{label} depends on task {dep}, which failed: {why}");
        self.fail_task(id, label, accesses, message.clone());
        Some(Error::aborted(message))
    }

    /// Dispatches task `id` on `chosen`, or — when that device's memory cannot hold the
    /// task's data even after eviction — on the next candidates in turn. A task that
    /// cannot start anywhere is recorded as failed (its dependants fail too).
    pub(super) fn start(
        &mut self,
        shared: &Shared,
        id: u64,
        p: &Pending,
        deps: &BTreeSet<u64>,
        chosen: (usize, usize),
        now: f64,
    ) -> Result<()> {
        let mut order = vec![chosen];
        order.extend(p.candidates.iter().copied().filter(|c| *c != chosen));
        let mut last = None;
        for (d, implementation) in order {
            match self.dispatch(
                shared,
                &p.task,
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
                    return Ok(());
                }
                Err(e @ Error::OutOfMemory { .. }) => last = Some((d, e)),
                Err(e) => {
                    last = Some((d, e));
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
        self.fail_task(id, &p.label, &p.accesses, message);
        Err(e)
    }

    /// Enqueues task `id` on device `d`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dispatch(
        &mut self,
        shared: &Shared,
        task: &Task,
        id: u64,
        label: &str,
        d: usize,
        implementation: usize,
        accesses: &[(Handle, AccessMode)],
        deps: &BTreeSet<u64>,
        footprint: u64,
        now: f64,
    ) -> Result<()> {
        let s = compute_stream(d);
        // Data: a replica of every handle on the device, valid for those it reads.
        let mut memories = Vec::with_capacity(accesses.len());
        for (h, m) in accesses {
            let memory = self.replica(shared, *h, d)?;
            if m.reads() {
                if let Some(p) = self.fetch(shared, *h, d, &memory)? {
                    wait_for(&mut self.streams, s, p)?;
                }
            }
            memories.push(memory);
        }
        // Dependencies on other streams.
        let dep_points: Vec<Point> = deps
            .iter()
            .filter_map(|t| self.tasks.get(t))
            .flat_map(TaskRecord::points)
            .collect();
        for p in dep_points {
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
                let samples = self
                    .models
                    .get(task.codelet.name())
                    .archs
                    .get(arch)
                    .and_then(|a| a.history.get(&footprint))
                    .map_or(0, |h| h.count);
                samples < CALIBRATION_SAMPLES || id.is_multiple_of(SAMPLE_EVERY)
            };
        let start = if timed {
            Some(self.streams[s].stream.record_event()?)
        } else {
            None
        };
        // The work.
        let stream = &self.streams[s].stream;
        match &task.codelet.implementations()[implementation] {
            Implementation::Builtin(op) => {
                let m = &memories;
                match *op {
                    Builtin::Fill { value } => stream.fill(&m[0], value)?,
                    Builtin::Binary { op, dtype } => {
                        stream.binary(op, dtype, &m[0], &m[1], &m[2])?
                    }
                    Builtin::Accumulate { op, dtype } => {
                        stream.accumulate(op, dtype, &m[0], &m[1])?
                    }
                    Builtin::Scale { alpha } => stream.scale(&m[0], &m[1], alpha)?,
                    Builtin::Cast { from, to } => stream.cast(&m[0], from, &m[1], to)?,
                }
            }
            Implementation::Kernel { dims, .. } => {
                let kernel = task
                    .codelet
                    .kernel(&shared.devices[d], implementation)?
                    .ok_or_else(|| Error::invalid(format!("{label}: no kernel")))?;
                let sizes: Vec<u64> = accesses.iter().map(|(h, _)| h.len).collect();
                let mut args: Vec<KernelArg<'_>> = memories
                    .iter()
                    .map(|m| KernelArg::Buffer(m.whole()))
                    .collect();
                args.extend(task.scalars.iter().map(|v| KernelArg::Scalar(*v)));
                stream.launch(&kernel, dims(&sizes), &args)?;
            }
        }
        let point = self.streams[s].advance(s);
        if let Some(start) = start {
            let end = self.streams[s].stream.record_event()?;
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
            self.measurements.push(Measurement {
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
        for (h, m) in accesses {
            if m.writes() {
                if let Some(hs) = self.handles.get_mut(&h.id) {
                    hs.written(d, point);
                }
            }
        }
        // Bookkeeping for placement.
        let predicted = self
            .models
            .predict(task.codelet.name(), arch, footprint)
            .unwrap_or(0.0);
        let dev = &mut self.devices[d];
        dev.busy_until = dev.busy_until.max(now) + predicted;
        dev.since_marker += 1;
        // With several devices every task that writes data gets its event, for readers
        // on other devices to wait for exactly it (see the `stream` module); the queued
        // policies count tasks in flight with them too.
        let writes = accesses.iter().any(|(_, m)| m.writes());
        let every = (shared.devices.len() > 1 && writes) || shared.policy.queued();
        if dev.since_marker >= MARKER_EVERY || every {
            dev.since_marker = 0;
            let e = self.streams[s].event_at_end()?;
            self.devices[d].markers.push_back((point.seq, e));
        }
        self.tasks.insert(
            id,
            TaskRecord {
                label: label.to_string(),
                point,
                extra: Vec::new(),
                failed: None,
            },
        );
        self.stats.placed[d] += 1;
        self.live[d].push_back((point.seq, id));
        Ok(())
    }
}
