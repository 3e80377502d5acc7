//! The rendezvous of operations that are not small: each rank's call arrives with its
//! buffers and stream; the last to arrive checks that every rank asked for the same
//! operation, then either runs it in shared memory on the ranks' own threads (every
//! buffer host addressable; idle streams run now, busy ones queue each rank's share as a
//! host function) or enqueues the chosen algorithm on every rank's stream (`run`).

use super::*;

impl Shared {
    /// Arrives at the next collective; returns when it has been enqueued on every rank,
    /// or run in shared memory (then `true`).
    pub(super) fn collective(&self, rank: usize, seq: u64, arrival: Arrival) -> Result<Outcome> {
        let mut st = self.lock();
        self.check_failed(&st)?;
        let n = self.devices.len();
        let pending = st.pending.get_or_insert_with(|| Pending {
            seq,
            arrivals: (0..n).map(|_| None).collect(),
        });
        if pending.seq != seq {
            return Err(Error::backend_message(
                "collectives",
                format!(
                    "internal error: rank {rank} arrived at operation #{seq} while #{} is pending",
                    pending.seq
                ),
            ));
        }
        let deferred = arrival.deferred.clone();
        pending.arrivals[rank] = Some(arrival);
        if pending.arrivals.iter().all(Option::is_some) {
            let Some(pending) = st.pending.take() else {
                return Err(Error::backend_message(
                    "collectives",
                    "internal error: no pending operation",
                ));
            };
            let deferred: Vec<Arc<grouped::Deferred>> = pending
                .arrivals
                .iter()
                .flatten()
                .filter_map(|a| a.deferred.clone())
                .collect();
            if !deferred.is_empty() {
                return self.plan_deferred(st, rank, seq, &pending, &deferred);
            }
            // Planned under the lock, so that a waiting rank finds either the operation
            // still pending or its share.
            if let Some((work, queued)) = self.plan_shared(seq, &pending) {
                let work = Arc::new(work);
                self.ran_shared.fetch_add(1, Ordering::Relaxed);
                st.shared = Some((seq, work.clone(), queued));
                drop(st);
                // After unlocking: a spinning rank that sees this takes the lock at once.
                self.finished_seq.store(seq + 1, Ordering::Release);
                self.wake();
                return self.take_part(rank, work, queued);
            }
            drop(st);
            let result = self.run(seq, pending);
            if result.is_ok() {
                self.ran_enqueued.fetch_add(1, Ordering::Relaxed);
            }
            let mut st = self.lock();
            if let Err(e) = &result {
                if matches!(e, Error::Aborted { .. }) || st.failed.is_some() {
                    // Already failed (or aborted while enqueueing): keep the first error.
                } else if !matches!(e, Error::InvalidArgument { .. }) {
                    self.set_failed(&mut st, e.clone());
                }
            }
            st.finished = Some((seq, result.clone()));
            self.finished_seq.store(seq + 1, Ordering::Release);
            drop(st);
            self.wake();
            return result.map(|()| Outcome::Enqueued);
        }
        if let Some(d) = deferred {
            // Called in a group: the rank's share waits for the plan on its stream.
            return Ok(Outcome::Deferred(d));
        }
        let deadline = Instant::now() + self.options.timeout;
        // Spin briefly before sleeping (see `wait.rs`).
        drop(st);
        self.spinner.spin(SPIN, || {
            self.finished_seq.load(Ordering::Acquire) > seq || self.aborted.load(Ordering::Acquire)
        });
        let mut st = self.lock();
        loop {
            if let Some((done, result)) = &st.finished {
                if *done == seq {
                    return result.clone().map(|()| Outcome::Enqueued);
                }
            }
            // Before failures: the other ranks wait for this rank's share.
            if let Some((planned, work, queued)) = &st.shared {
                if *planned == seq {
                    let (work, queued) = (work.clone(), *queued);
                    drop(st);
                    return self.take_part(rank, work, queued);
                }
            }
            self.check_failed(&st)?;
            let now = Instant::now();
            if now >= deadline {
                let error = self.timeout_error(&st, seq);
                self.set_failed(&mut st, error.clone());
                drop(st);
                self.arrived.notify_all();
                return Err(error);
            }
            self.sleepers.fetch_add(1, Ordering::AcqRel);
            st = self
                .arrived
                .wait_timeout(st, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
            self.sleepers.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Wakes the ranks asleep on `arrived`, if any. Call after changing the state under
    /// its lock: a rank that went to sleep before that change is counted by then.
    pub(super) fn wake(&self) {
        if self.sleepers.load(Ordering::Acquire) > 0 {
            self.arrived.notify_all();
        }
    }

    /// The last arrival at an operation some of whose ranks were called in a group
    /// (`grouped.rs`): planned in shared memory, every share queued on its stream, the
    /// deferred ranks handed the plan. An operation that cannot run so fails on every
    /// rank.
    fn plan_deferred(
        &self,
        mut st: MutexGuard<'_, State>,
        rank: usize,
        seq: u64,
        pending: &Pending,
        deferred: &[Arc<grouped::Deferred>],
    ) -> Result<Outcome> {
        let planned = match self.plan_shared(seq, pending) {
            Some((work, _)) => Ok(Arc::new(work)),
            None => Err(match self.agreed(seq, pending) {
                Err(e) => e,
                Ok(desc) => Error::unsupported(format!(
                    "{desc} #{seq} was called in a group but cannot run in shared memory on the ranks' streams (an override forces another algorithm, or a buffer has no host view)"
                )),
            }),
        };
        match &planned {
            Ok(work) => {
                self.ran_shared.fetch_add(1, Ordering::Relaxed);
                st.shared = Some((seq, work.clone(), true));
            }
            Err(e) => {
                if !matches!(e, Error::InvalidArgument { .. }) {
                    self.set_failed(&mut st, e.clone());
                }
                st.finished = Some((seq, Err(e.clone())));
            }
        }
        drop(st);
        for d in deferred {
            d.plan(planned.clone());
        }
        self.finished_seq.store(seq + 1, Ordering::Release);
        self.wake();
        match planned {
            Ok(work) => self.take_part(rank, work, true),
            Err(e) => Err(e),
        }
    }

    /// The operation every rank asked for, or why they do not agree: a rank refused its
    /// arguments, or ranks asked for different operations (a desync).
    fn agreed(&self, seq: u64, pending: &Pending) -> Result<OpDesc> {
        let mut first: Option<OpDesc> = None;
        for (r, a) in pending.arrivals.iter().enumerate() {
            let Some(a) = a else {
                return Err(Error::backend_message(
                    "collectives",
                    "internal error: a rank is missing",
                ));
            };
            let d = match &a.desc {
                Ok(d) => *d,
                Err(e) => return Err(self.refused(seq, r, Some(e))),
            };
            match first {
                None => first = Some(d),
                Some(f) if f != d => {
                    return Err(Error::invalid(format!(
                        "desync at operation #{seq}: {} called {f} but {} called {d}; every rank must call the same operations in the same order",
                        self.rank_name(0),
                        self.rank_name(r)
                    )))
                }
                Some(_) => {}
            }
        }
        first.ok_or_else(|| {
            Error::backend_message("collectives", "internal error: an operation of no ranks")
        })
    }

    /// This rank's part of a shared-memory operation: its share now, or (`queued`) the
    /// share for its stream to run.
    pub(super) fn take_part(&self, rank: usize, work: Arc<Work>, queued: bool) -> Result<Outcome> {
        if queued {
            return Ok(Outcome::Queued(work));
        }
        work.participate(rank, self.spinner)
            .map(|()| Outcome::Shared)
    }

    /// The operation as shares, when it can run that way: every rank brought host views
    /// of its buffers, all asked for the same thing, and no override names another
    /// algorithm. With every stream idle the ranks' threads run the shares now; otherwise,
    /// when every device runs host functions, each stream runs its share when it gets
    /// there (then `true`).
    pub(super) fn plan_shared(&self, seq: u64, pending: &Pending) -> Option<(Work, bool)> {
        if self.aborted.load(Ordering::Acquire) {
            return None;
        }
        let mut descs = Vec::with_capacity(pending.arrivals.len());
        let mut buffers = Vec::with_capacity(pending.arrivals.len());
        let mut host = Vec::with_capacity(pending.arrivals.len());
        let mut idle = true;
        for a in &pending.arrivals {
            let a = a.as_ref()?;
            descs.push(*a.desc.as_ref().ok()?);
            buffers.push(a.buffers.clone());
            host.push(a.host.clone()?);
            idle &= a.idle;
        }
        let queued = !idle;
        if queued && !self.host_functions {
            return None;
        }
        let first = descs[0];
        if descs.iter().any(|d| *d != first) {
            return None;
        }
        if let Some(forced) = self.options.selector.forced(first.kind, first.bytes) {
            if forced != Algorithm::SharedMemory {
                return None;
            }
        }
        let work = Work::plan(&first, &buffers, &host)?;
        tracing::debug!(
            seq,
            op = %first,
            algorithm = Algorithm::SharedMemory.name(),
            reason = if queued {
                "every buffer is host-addressable; the shares run on the streams"
            } else {
                "every buffer is host-addressable and every stream idle"
            },
            "collective algorithm chosen"
        );
        Some((work, queued))
    }

    /// Checks that every rank asked for the same, then enqueues the operation.
    pub(super) fn run(&self, seq: u64, pending: Pending) -> Result<()> {
        let first = self.agreed(seq, &pending)?;
        let (ios, buffers): (Vec<RankIo>, Vec<RankBuffers>) = pending
            .arrivals
            .into_iter()
            .flatten()
            .map(|a| (a.io, a.buffers))
            .unzip();
        // Shared memory was not possible (`plan_shared`): the best enqueued algorithm.
        let (algorithm, why) =
            self.options
                .selector
                .choose_where(&self.model, first.kind, first.bytes, |a| {
                    a != Algorithm::SharedMemory
                });
        tracing::debug!(
            seq,
            op = %first,
            algorithm = algorithm.name(),
            reason = %why,
            "collective algorithm chosen"
        );
        let groups = self.topology.groups();
        let mut transport = self.transport.lock().unwrap_or_else(|p| p.into_inner());
        let mut run = Run {
            ranks: &ios,
            buffers: &buffers,
            transport: &mut transport,
            algorithm,
            kind: first.kind,
            bytes: first.bytes,
            dtype: first.dtype,
            op: first.op,
            root: first.root.unwrap_or(0),
            groups: &groups,
            native: self.native.as_deref(),
        };
        run.execute().map_err(|e| {
            Error::aborted(format!(
                "{first} #{seq} failed while it was being enqueued, so the ranks' streams hold part of it ({e}); the communicator is now failed: synchronize the streams, then make a new one"
            ))
        })
    }
}
