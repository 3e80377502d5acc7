//! Recording a profile (see the `profile` module for the format).

use super::*;

impl Scheduler {
    /// Starts recording a profile (see [`crate::profile`]): waits for the work already
    /// enqueued, then times every task and copy from here on. Restarts a profile that
    /// is being recorded. A replayed graph's runs are split into their tasks, each with
    /// its span ([`Scheduler::replay`]), which costs the submitting thread per task.
    pub fn start_profiling(&self) -> Result<()> {
        self.profile(true)
    }

    /// [`Scheduler::start_profiling`], except that a replayed graph's runs keep running
    /// as one task each, with one span each (named after the run): replaying costs what
    /// it costs unprofiled, so the profile shows the devices as they run then (their
    /// busy shares, the overlap of collectives), at the grain of runs.
    pub fn start_profiling_runs(&self) -> Result<()> {
        self.profile(false)
    }

    fn profile(&self, split_runs: bool) -> Result<()> {
        let mut st = self.lock();
        let started = Instant::now();
        let mut origins = Vec::with_capacity(self.shared.devices.len());
        for (d, device) in self.shared.devices.iter().enumerate() {
            if !device.capabilities().event_timing {
                origins.push(None);
                continue;
            }
            for s in [copy_stream(d), compute_stream(d)] {
                st.streams[s].stream.synchronize()?;
            }
            let origin = st.streams[compute_stream(d)].stream.record_event()?;
            origin.wait()?;
            origins.push(Some((origin, started.elapsed().as_secs_f64())));
        }
        st.profiling = Some(Profiling {
            started,
            origins,
            spans: Vec::new(),
            memory: Vec::new(),
            split_runs,
        });
        Ok(())
    }

    /// Stops profiling and returns the profile, once everything profiled has run.
    pub fn stop_profiling(&self) -> Result<Profile> {
        self.wait_all()?;
        let mut st = self.lock();
        let Some(p) = st.profiling.take() else {
            return Err(Error::invalid(
                "no profile is being recorded; call start_profiling first (or set XPU_PROFILE)",
            ));
        };
        Ok(finish_profile(&self.shared, p))
    }

    /// Stops profiling and writes the Chrome/Perfetto trace to `path`; returns the
    /// profile.
    pub fn write_profile(&self, path: &std::path::Path) -> Result<Profile> {
        let profile = self.stop_profiling()?;
        write_trace(&profile, path)?;
        Ok(profile)
    }
}

/// Reads the profiled events (the work has run) into a [`Profile`].
pub(super) fn finish_profile(shared: &Shared, p: Profiling) -> Profile {
    let mut spans = Vec::with_capacity(p.spans.len());
    let mut length: f64 = 0.0;
    for span in p.spans {
        let Some(Some((origin, zero))) = p.origins.get(span.device) else {
            continue;
        };
        let (Ok(a), Ok(b)) = (
            span.start.elapsed_since(origin),
            span.end.elapsed_since(origin),
        ) else {
            continue;
        };
        let (start, end) = (zero + a.as_secs_f64(), zero + b.as_secs_f64());
        length = length.max(end);
        spans.push(Span {
            kind: span.kind,
            name: span.name,
            task: span.task,
            device: span.device,
            stream: span.stream,
            start,
            end,
            bytes: span.bytes,
            deps: span.deps,
        });
    }
    Profile {
        devices: shared.devices.iter().map(|d| d.id().to_string()).collect(),
        timed: p.origins.iter().map(Option::is_some).collect(),
        spans,
        memory: p.memory,
        length,
    }
}

/// Writes `profile`'s trace to `path`.
pub(super) fn write_trace(profile: &Profile, path: &std::path::Path) -> Result<()> {
    let text = serde_json::to_string(&profile.to_chrome_json())
        .map_err(|e| Error::backend_message("scheduler", e.to_string()))?;
    std::fs::write(path, text).map_err(|e| {
        Error::invalid(format!(
            "could not write the profile to {}: {e}",
            path.display()
        ))
    })
}

impl State {
    /// When profiling device `d`: an event on stream `s` before a copy.
    pub(super) fn profiling_start(&mut self, d: usize, s: usize) -> Result<Option<Event>> {
        let timed = self
            .profiling
            .as_ref()
            .is_some_and(|p| p.origins.get(d).is_some_and(Option::is_some));
        if timed {
            Ok(Some(self.streams[s].stream.record_event()?))
        } else {
            Ok(None)
        }
    }

    /// Closes a copy's span begun by [`State::profiling_start`]; returns the end event.
    pub(super) fn profiling_end(
        &mut self,
        start: Option<Event>,
        kind: SpanKind,
        handle: u64,
        d: usize,
        bytes: u64,
        point: Point,
    ) -> Result<Option<Event>> {
        let s = point.stream;
        let Some(start) = start else {
            return Ok(None);
        };
        let Some(end) = self.streams[s].event_after(point.seq) else {
            return Ok(None);
        };
        if let Some(p) = &mut self.profiling {
            p.spans.push(PendingSpan {
                kind,
                name: format!("handle {handle}"),
                task: None,
                device: d,
                stream: usize::from(s == copy_stream(d)),
                bytes,
                deps: Vec::new(),
                start,
                end: end.clone(),
            });
        }
        Ok(Some(end))
    }

    /// Notes a change of the replica bytes held on device `d`.
    pub(super) fn replica_bytes_changed(&mut self, d: usize, added: u64, removed: u64) {
        let held = &mut self.replica_bytes[d];
        *held = held.saturating_add(added).saturating_sub(removed);
        let bytes = *held;
        if let Some(p) = &mut self.profiling {
            p.memory.push(MemorySample {
                device: d,
                at: p.started.elapsed().as_secs_f64(),
                bytes,
            });
        }
    }
}
