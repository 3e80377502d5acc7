//! Collectives over handles as tasks.

use super::*;

impl Scheduler {
    /// A collective over one handle per rank of `comm` in this process, as a task: the
    /// `r`-th of this process's ranks has handles `send[r]` (read) and `recv[r]`
    /// (written; the same handle as `send[r]` for an in-place operation), on its device,
    /// which must be one of the scheduler's. (For a communicator within one process
    /// those are all its ranks; for one across processes, each process submits the
    /// collective with its own ranks' handles, every process in the same order.)
    /// It waits for what wrote those handles, and what reads them after waits for it,
    /// like any task; the operation itself is enqueued on each rank's device on a
    /// stream of its own, so it overlaps the work every device does meanwhile,
    /// including the rank's own device. Under the queued policies the
    /// call first waits until every task submitted before it has been dispatched.
    pub fn collective(
        &self,
        comm: &Communicator,
        kind: CollectiveTask,
        send: &[Handle],
        recv: &[Handle],
    ) -> Result<TaskId> {
        // Every rank's blocks count in the sizes; handles are given for this
        // process's ranks.
        let n = comm.size();
        let here = comm.devices().len();
        let label: Arc<str> = Arc::from(kind.name());
        if send.len() != here || recv.len() != here {
            let whose = if here == n {
                format!("the communicator has {n} ranks")
            } else {
                format!("this process holds {here} of the communicator's {n} ranks")
            };
            return Err(Error::invalid(format!(
                "{label}: {whose} but {} send and {} receive handles were given; give one of each per rank",
                send.len(),
                recv.len()
            )));
        }
        let mut ranks = Vec::with_capacity(n);
        for (r, device) in comm.devices().iter().enumerate() {
            let Some(d) = self.shared.devices.iter().position(|x| x == device) else {
                return Err(Error::invalid(format!(
                    "{label}: rank {} is on {}, which is not one of this scheduler's devices",
                    comm.first_rank() + r,
                    device.id()
                )));
            };
            ranks.push(d);
        }
        for (r, (s, v)) in send.iter().zip(recv).enumerate() {
            let (bytes_s, bytes_r) = (s.len, v.len);
            let ok = match kind {
                CollectiveTask::AllReduce { .. } => bytes_s == bytes_r,
                CollectiveTask::ReduceScatter { .. } => bytes_s == bytes_r * n as u64,
                CollectiveTask::AllGather => bytes_r == bytes_s * n as u64,
            };
            if !ok {
                return Err(Error::invalid(format!(
                    "{label}: rank {r}'s send handle is {bytes_s} bytes and its receive handle {bytes_r}; {}",
                    kind.sizes()
                )));
            }
        }
        let mut st = self.drained();
        st.poll(&self.shared);
        let mut seen = BTreeSet::new();
        for h in send.iter().chain(recv) {
            if !st.handles.contains_key(&h.id) {
                return Err(Error::invalid(format!(
                    "{label}: {h} is not registered with this scheduler (unregistered, or from another one)"
                )));
            }
            seen.insert(h.id);
        }
        let distinct = send
            .iter()
            .zip(recv)
            .map(|(s, v)| if s.id == v.id { 1 } else { 2 })
            .sum::<usize>();
        if seen.len() != distinct {
            return Err(Error::invalid(format!(
                "{label}: a handle appears on two ranks; each rank needs handles of its own"
            )));
        }
        let id = st.next_task;
        st.next_task += 1;
        st.stats.tasks += 1;
        let mut deps = BTreeSet::new();
        let accesses = collective_accesses(send, recv);
        for (h, m) in &accesses {
            st.access(h.id, id, *m, 0, &mut deps);
        }
        if let Some(e) = st.fails_with_dependency(id, &label, &accesses, &deps, &[]) {
            return Err(e);
        }
        match st.run_collective(
            &self.shared,
            comm,
            kind,
            id,
            &label,
            &ranks,
            send,
            recv,
            &accesses,
            &deps,
        ) {
            Ok(()) => {
                if let Some(rec) = &mut st.recording {
                    rec.collective(id, comm, kind, send, recv, &ranks, &accesses, &deps);
                }
                Ok(TaskId(id))
            }
            Err(e) => {
                st.fail_task(id, &label, &accesses, &deps, format!("{label} failed: {e}"));
                Err(e)
            }
        }
    }

    /// An in-place all-reduce of one handle per rank (see [`Scheduler::collective`]).
    pub fn all_reduce(
        &self,
        comm: &Communicator,
        handles: &[Handle],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<TaskId> {
        self.collective(
            comm,
            CollectiveTask::AllReduce { dtype, op },
            handles,
            handles,
        )
    }
}

/// A collective a [`Scheduler`] runs as a task ([`Scheduler::collective`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CollectiveTask {
    /// Every rank's receive handle becomes the reduction of all send handles (same
    /// size).
    AllReduce {
        /// Element type.
        dtype: DType,
        /// The reduction.
        op: ReduceOp,
    },
    /// Rank `r`'s receive handle becomes block `r` of the reduction of all send handles
    /// (each ranks × the receive handle's size).
    ReduceScatter {
        /// Element type.
        dtype: DType,
        /// The reduction.
        op: ReduceOp,
    },
    /// Every rank's receive handle (ranks × the send handle's size) becomes all send
    /// handles in rank order.
    AllGather,
}

impl CollectiveTask {
    /// Its name (`all_reduce` …), for messages and traces.
    pub fn name(&self) -> &'static str {
        match self {
            CollectiveTask::AllReduce { .. } => "all_reduce",
            CollectiveTask::ReduceScatter { .. } => "reduce_scatter",
            CollectiveTask::AllGather => "all_gather",
        }
    }

    fn sizes(&self) -> &'static str {
        match self {
            CollectiveTask::AllReduce { .. } => "an all-reduce needs both the same size",
            CollectiveTask::ReduceScatter { .. } => {
                "a reduce-scatter's send handle is ranks × its receive handle"
            }
            CollectiveTask::AllGather => {
                "an all-gather's receive handle is ranks × its send handle"
            }
        }
    }
}

impl State {
    /// Enqueues collective task `id` on each rank's collective stream (so that the
    /// device's tasks go on while the rank waits for the others): every rank's data on
    /// its device, its collective stream behind the points it depends on, then the
    /// ranks' calls: from this thread, in a group
    /// ([`Communicator::grouped`]) where the communicator allows it; else together, each
    /// from a thread of its own (each rank's call returns once all have arrived).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_collective(
        &mut self,
        shared: &Shared,
        comm: &Communicator,
        kind: CollectiveTask,
        id: u64,
        label: &Arc<str>,
        ranks: &[usize],
        send: &[Handle],
        recv: &[Handle],
        accesses: &[(Handle, AccessMode)],
        deps: &BTreeSet<u64>,
    ) -> Result<()> {
        let dep_points = self.dep_points(deps);
        let mut memory = Vec::with_capacity(ranks.len());
        for (r, &d) in ranks.iter().enumerate() {
            let s = collective_stream(d);
            let m_send = self.replica(shared, send[r], d)?;
            if let Some(p) = self.fetch(shared, send[r], d, &m_send)? {
                wait_for(&mut self.streams, s, p)?;
            }
            let m_recv = if recv[r].id == send[r].id {
                m_send.clone()
            } else {
                self.replica(shared, recv[r], d)?
            };
            for p in &dep_points {
                wait_for(&mut self.streams, s, *p)?;
            }
            memory.push((m_send, m_recv, self.streams[s].stream.clone()));
        }
        // Timed on each rank's stream when profiling, like a task.
        let mut starts = Vec::with_capacity(ranks.len());
        for &d in ranks {
            let profiled = self
                .profiling
                .as_ref()
                .is_some_and(|p| p.origins.get(d).is_some_and(Option::is_some));
            starts.push(if profiled {
                Some(self.streams[collective_stream(d)].stream.record_event()?)
            } else {
                None
            });
        }
        let first = comm.first_rank();
        let call = |r: usize| -> Result<()> {
            let (send, recv, stream) = &memory[r];
            let rank = comm.rank(first + r)?;
            match kind {
                CollectiveTask::AllReduce { dtype, op } => {
                    rank.all_reduce(send, recv, dtype, op, stream)
                }
                CollectiveTask::ReduceScatter { dtype, op } => {
                    rank.reduce_scatter(send, recv, dtype, op, stream)
                }
                CollectiveTask::AllGather => rank.all_gather(send, recv, stream),
            }
        };
        let outcome = if comm.can_group() {
            // One thread calls every rank: no call waits for another, and no thread
            // has to be woken on cores busy with the devices' work.
            comm.grouped(|| (0..ranks.len()).try_for_each(call))
        } else {
            let outcomes: Vec<Result<()>> = std::thread::scope(|scope| {
                let others: Vec<_> = (1..ranks.len())
                    .map(|r| scope.spawn(move || call(r)))
                    .collect();
                let mut all = vec![call(0)];
                for h in others {
                    all.push(h.join().unwrap_or_else(|_| {
                        Err(Error::aborted("a rank's thread of the collective panicked"))
                    }));
                }
                all
            });
            outcomes.into_iter().find(Result::is_err).unwrap_or(Ok(()))
        };
        if let Err(e) = outcome {
            comm.abort();
            return Err(e);
        }
        let mut points = Vec::with_capacity(ranks.len());
        for (r, &d) in ranks.iter().enumerate() {
            let s = collective_stream(d);
            let point = self.streams[s].advance(s)?;
            if let Some(h) = self.handles.get_mut(&recv[r].id) {
                h.written(d, point, send[r].id != recv[r].id, id);
            }
            self.stats.placed[d] += 1;
            self.live[s].push_back((point.seq, id));
            points.push(point);
            if let (Some(start), Some(end)) =
                (starts[r].take(), self.streams[s].event_after(point.seq))
            {
                if let Some(p) = &mut self.profiling {
                    p.spans.push(PendingSpan {
                        kind: SpanKind::Task,
                        name: label.to_string(),
                        task: Some(id),
                        device: d,
                        stream: 2,
                        bytes: send[r].len,
                        deps: Vec::new(),
                        start,
                        end,
                    });
                }
            }
        }
        self.tasks.insert(
            id,
            TaskRecord {
                label: label.clone(),
                point: points[0],
                extra: points[1..].to_vec(),
                failed: None,
                inputs: Points::new(),
                through: Vec::new(),
                redo: None,
                collective: accesses.to_vec(),
            },
        );
        Ok(())
    }
}

/// What a collective accesses: each rank's send handle read and receive handle written
/// (read and written when they are the same handle).
fn collective_accesses(send: &[Handle], recv: &[Handle]) -> Vec<(Handle, AccessMode)> {
    let mut accesses = Vec::with_capacity(send.len() + recv.len());
    for (s, r) in send.iter().zip(recv) {
        if s.id == r.id {
            accesses.push((*r, AccessMode::ReadWrite));
        } else {
            accesses.push((*s, AccessMode::Read));
            accesses.push((*r, AccessMode::Write));
        }
    }
    accesses
}
