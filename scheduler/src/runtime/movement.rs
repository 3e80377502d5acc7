//! Data movement: replicas, fetches, write-backs, eviction.

use super::*;

impl State {
    /// A replica of `handle` on device `d`, allocated if missing.
    pub(super) fn replica(
        &mut self,
        shared: &Shared,
        handle: Handle,
        d: usize,
    ) -> Result<Allocation> {
        self.clock += 1;
        let clock = self.clock;
        if let Some(Some(r)) = self.handles.get_mut(&handle.id).map(|h| &mut h.replicas[d]) {
            r.last_use = clock;
            return Ok(r.memory.clone());
        }
        let device = &shared.devices[d];
        let memory = match device.allocate(handle.len) {
            Ok(m) => m,
            Err(Error::OutOfMemory { .. }) => {
                self.evict(shared, d, handle.len, handle)?;
                match device.allocate(handle.len) {
                    Ok(m) => m,
                    Err(Error::OutOfMemory { .. }) => {
                        // Evicted replicas are freed once the work queued on them has
                        // run: wait for the device, then try again.
                        for s in [compute_stream(d), copy_stream(d)] {
                            if let Err(e) = self.streams[s].stream.synchronize() {
                                self.errors.push(e);
                            }
                        }
                        device.allocate(handle.len)?
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        if let Some(h) = self.handles.get_mut(&handle.id) {
            h.replicas[d] = Some(Replica {
                memory: memory.clone(),
                valid: false,
                ready: None,
                last_use: clock,
                generation: clock,
            });
        }
        self.replica_bytes_changed(d, handle.len, 0);
        Ok(memory)
    }

    /// Frees at least `need` bytes of replicas on device `d` (never `keep`'s), least
    /// recently used first; a replica that holds the only valid copy is written back to
    /// its home first.
    pub(super) fn evict(
        &mut self,
        shared: &Shared,
        d: usize,
        need: u64,
        keep: Handle,
    ) -> Result<()> {
        let mut victims: Vec<(u64, u64)> = self
            .handles
            .values()
            .filter(|h| h.handle.id != keep.id)
            .filter_map(|h| h.replicas[d].as_ref().map(|r| (r.last_use, h.handle.id)))
            .collect();
        victims.sort_unstable();
        let mut freed = 0;
        for (_, id) in victims {
            if freed >= need {
                break;
            }
            let sole = self.handles.get(&id).is_some_and(|h| {
                h.replicas[d].as_ref().is_some_and(|r| r.valid)
                    && !h.home.valid
                    && h.valid_on().all(|e| e == d)
            });
            if sole {
                self.write_home(shared, id, d)?;
            }
            if let Some(h) = self.handles.get_mut(&id) {
                if let Some(r) = h.replicas[d].take() {
                    freed += r.memory.size();
                    self.stats.evictions += 1;
                    let size = r.memory.size();
                    self.replica_bytes_changed(d, 0, size);
                }
            }
        }
        if freed < need {
            return Err(Error::OutOfMemory {
                device: shared.devices[d].id().to_string(),
                requested: need,
                free: freed,
                capacity: shared.devices[d].info().memory_bytes,
                hint: "the handles one task uses do not fit the device together; use smaller handles or a device with more memory".to_string(),
            });
        }
        Ok(())
    }

    /// Copies device `d`'s replica of handle `id` to its home (which becomes valid).
    pub(super) fn write_home(&mut self, shared: &Shared, id: u64, d: usize) -> Result<()> {
        let s = copy_stream(d);
        let (memory, ready) = match self.handles.get(&id).and_then(|h| h.replicas[d].as_ref()) {
            Some(r) => (r.memory.clone(), r.ready),
            None => return Ok(()),
        };
        if let Some(p) = ready {
            wait_for(&mut self.streams, s, p)?;
        }
        let profiled = self.profiling_start(d, s)?;
        let Some(h) = self.handles.get_mut(&id) else {
            return Ok(());
        };
        self.streams[s]
            .stream
            .copy_to_host(&memory, &h.home.buffer, 0)?;
        let point = self.streams[s].advance(s)?;
        self.profiling_end(profiled, SpanKind::WriteBack, id, d, memory.size(), point)?;
        let streams = &self.streams;
        let Some(h) = self.handles.get_mut(&id) else {
            return Ok(());
        };
        h.journal(point, Change::Copy(Place::Home), |p| {
            p.seq <= streams[p.stream].completed
        });
        h.home.valid = true;
        h.home.ready = Some(point);
        self.stats.write_backs += 1;
        self.stats.bytes_moved += memory.size();
        let _ = shared;
        Ok(())
    }

    /// Makes device `d`'s replica of `handle` valid, copying from the cheapest valid
    /// copy; returns the point after which it is.
    pub(super) fn fetch(
        &mut self,
        shared: &Shared,
        handle: Handle,
        d: usize,
        dst: &Allocation,
    ) -> Result<Option<Point>> {
        let Some(h) = self.handles.get(&handle.id) else {
            return Err(unknown(handle));
        };
        if let Some(r) = &h.replicas[d] {
            if r.valid {
                return Ok(r.ready);
            }
        }
        // A copy too small to gain from overlap goes on the task stream: one hand-off
        // between threads fewer on the way to the task that needs it.
        let s = if handle.len < OVERLAP_MIN_BYTES {
            compute_stream(d)
        } else {
            copy_stream(d)
        };
        // A peer copy from a device of the same backend that allows it.
        let device = &shared.devices[d];
        let peer = h.valid_on().find(|&e| {
            let other = &shared.devices[e];
            other.backend() == device.backend()
                && device.capabilities().peer_access
                && other.capabilities().peer_access
        });
        let point = if let Some(e) = peer {
            let (src, ready) = match &h.replicas[e] {
                Some(r) => (r.memory.clone(), r.ready),
                None => return Err(unknown(handle)),
            };
            if let Some(p) = ready {
                wait_for(&mut self.streams, s, p)?;
            }
            let profiled = self.profiling_start(d, s)?;
            self.streams[s].stream.copy_peer(&src, dst)?;
            let point = self.streams[s].advance(s)?;
            self.profiling_end(profiled, SpanKind::Fetch, handle.id, d, handle.len, point)?;
            point
        } else {
            if !h.home.valid {
                let Some(e) = h.valid_on().next() else {
                    return Err(Error::aborted(format!(
                        "{handle} has no valid copy anywhere: {}",
                        h.value_lost(u64::MAX)
                            .unwrap_or("no task has written it since its copies were dropped")
                    )));
                };
                self.write_home(shared, handle.id, e)?;
            }
            let Some(h) = self.handles.get(&handle.id) else {
                return Err(unknown(handle));
            };
            if let Some(p) = h.home.ready {
                wait_for(&mut self.streams, s, p)?;
            }
            // Copies from the home are timed now and then, to learn the bandwidth.
            self.copies += 1;
            let timed = shared.devices[d].capabilities().event_timing
                && handle.len >= MIN_TIMED_COPY
                && (self.devices[d].bandwidth.is_none()
                    || self.copies.is_multiple_of(SAMPLE_EVERY));
            let profiled = self.profiling_start(d, s)?;
            let start = match (&profiled, timed) {
                (Some(e), _) => Some(e.clone()),
                (None, true) => Some(self.streams[s].stream.record_event()?),
                (None, false) => None,
            };
            let Some(h) = self.handles.get(&handle.id) else {
                return Err(unknown(handle));
            };
            self.streams[s]
                .stream
                .copy_from_host(&h.home.buffer, 0, dst)?;
            let point = self.streams[s].advance(s)?;
            self.profiling_end(profiled, SpanKind::Fetch, handle.id, d, handle.len, point)?;
            if let Some(start) = start {
                let Some(end) = self.streams[s].event_after(point.seq) else {
                    return Err(Error::backend_message(
                        "scheduler",
                        "internal error: no event after a copy",
                    ));
                };
                self.measurements[s].push_back(Measurement {
                    what: Timed::Copy {
                        device: d,
                        bytes: handle.len,
                    },
                    start,
                    end,
                });
            }
            point
        };
        let streams = &self.streams;
        if let Some(h) = self.handles.get_mut(&handle.id) {
            h.journal(point, Change::Copy(Place::Device(d)), |p| {
                p.seq <= streams[p.stream].completed
            });
            if let Some(r) = &mut h.replicas[d] {
                r.valid = true;
                r.ready = Some(point);
            }
        }
        self.stats.fetches += 1;
        self.stats.bytes_moved += handle.len;
        Ok(Some(point))
    }

    /// Makes the home of `handle` valid and waits until every task submitted so far that
    /// uses it has run. Returns the errors the streams reported meanwhile, by stream
    /// (the caller recovers from them and tries again).
    pub(super) fn bring_home(
        &mut self,
        shared: &Shared,
        handle: Handle,
    ) -> Result<Vec<Option<Error>>> {
        let Some(h) = self.handles.get(&handle.id) else {
            return Err(unknown(handle));
        };
        let source = if h.home.valid {
            None
        } else {
            h.valid_on().next()
        };
        if let Some(e) = source {
            self.write_home(shared, handle.id, e)?;
        }
        // Every stream, so that every copy and task that used the home has also let go
        // of it (the lock keeps new work out meanwhile).
        let taken = self
            .streams
            .iter()
            .enumerate()
            .map(|(s, slot)| {
                if self.devices[device_of(s)].lost.is_some() {
                    return None;
                }
                slot.stream.synchronize().err()
            })
            .collect();
        Ok(taken)
    }
}
