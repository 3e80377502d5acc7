//! [`Rank`]: one rank's handle, and the operations its thread calls. Each operation
//! checks its arguments (`args.rs`), then takes the small path (`small.rs`) or arrives
//! at the rendezvous (`mod.rs`), staging its buffers through host memory first where
//! that lets the operation run in shared memory (`staging.rs`).

use super::args::{
    check_aliasing, check_all_reduce, check_dtype, check_len, check_slice, Args, Range,
};
use super::*;

/// One rank of a communicator: the handle its driving thread calls operations on.
#[derive(Clone)]
pub struct Rank {
    pub(super) shared: Arc<Shared>,
    /// The rank's index among this process's ranks.
    pub(super) rank: usize,
    /// The communicator's processes, when it spans more than this one.
    pub(super) span: Option<Arc<span::Span>>,
}

impl std::fmt::Debug for Rank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rank")
            .field("rank", &self.rank)
            .field("device", &self.device().id().to_string())
            .finish()
    }
}

impl Rank {
    /// This rank's number.
    pub fn rank(&self) -> usize {
        match self.span() {
            Some(span) => span.procs[span.me].first_rank + self.rank,
            None => self.rank,
        }
    }

    /// The number of ranks (in every process, for a communicator across processes).
    pub fn size(&self) -> usize {
        match self.span() {
            Some(span) => span.size,
            None => self.shared.devices.len(),
        }
    }

    /// This rank's device.
    pub fn device(&self) -> &Device {
        &self.shared.devices[self.rank]
    }

    pub(super) fn check_stream(&self, stream: &Stream) -> Result<()> {
        if stream.device() != self.device() {
            return Err(Error::invalid(format!(
                "the stream is on {}, but rank {} is {}; enqueue on a stream of the rank's device",
                stream.device().id(),
                self.rank,
                self.device().id()
            )));
        }
        Ok(())
    }

    fn io(&self, stream: &Stream) -> Result<RankIo> {
        self.check_stream(stream)?;
        Ok(RankIo {
            device: self.device().clone(),
            stream: stream.clone(),
        })
    }

    fn arrive<'a>(
        &self,
        stream: &Stream,
        build: impl FnOnce() -> Result<(OpDesc, Args<'a>)>,
    ) -> Result<()> {
        self.check_stream(stream)?;
        let (desc, args) = match build() {
            Ok((d, b)) => (Ok(d), b),
            Err(e) => (Err(e), Args::NONE),
        };
        let sh = &self.shared;
        if sh.aborted.load(Ordering::Acquire) || sh.failed_flag.load(Ordering::Acquire) {
            return Err(sh.failure());
        }
        let grouped = grouped::in_group(sh);
        if grouped {
            // The ranks called before this one in the group have queued their parts:
            // an operation this rank cannot take part in fails them all.
            let refusal = match &desc {
                Err(e) => Some(e.clone()),
                Ok(d) if !self.small_path(d) && !self.may_share(d) => Some(Error::unsupported(
                    format!("{d} cannot run in a group of calls: an override (XPU_COLL_ALGO) forces an algorithm other than shared memory for it"),
                )),
                Ok(_) => None,
            };
            if let Some(e) = refusal {
                sh.fail(Error::aborted(format!(
                    "{} refused an operation called in a group, after other ranks had queued theirs: {e}",
                    sh.rank_name(self.rank)
                )));
                return Err(e);
            }
        }
        let seq = sh.seqs[self.rank].fetch_add(1, Ordering::Relaxed);
        if let Some(slots) = &sh.slots {
            match &desc {
                Ok(d) if self.small_path(d) => {
                    return self.small(slots, seq, *d, &args, stream, grouped)
                }
                Ok(d) if sh.is_through(self.rank, seq) => {
                    sh.announce(slots, self.rank, seq, Some(*d))?
                }
                Ok(d) => self.announce_queued(slots, seq, *d, stream)?,
                Err(e) => {
                    // Refused here: go the way the others went, so they learn of it.
                    sh.refuse(slots, self.rank, seq, e)?;
                    sh.await_slots(slots, self.rank, seq, &"the operation")?;
                    let theirs = (0..self.size()).find_map(|q| slots.desc(q, seq));
                    if theirs.is_some_and(|d| self.small_path(&d)) {
                        return Err(sh.refused(seq, self.rank, Some(e)));
                    }
                }
            }
        }
        let buffers = args.owned();
        let io = self.io(stream)?;
        let idle = matches!(io.stream.query(), Ok(true));
        let mut staged: Option<Staged> = None;
        let host = match &desc {
            Ok(d) => {
                // The root of an in-place broadcast reads its receive buffer.
                let recv_is_input = d.kind == Collective::Broadcast
                    && d.root == Some(self.rank)
                    && buffers.send.is_none();
                self.host_buffers(&io, &buffers, idle, recv_is_input, &mut staged)
            }
            Err(_) => None,
        };
        let stream = io.stream.clone();
        let shared = self.shared.collective(
            self.rank,
            seq,
            Arrival {
                desc,
                io,
                buffers,
                host,
                idle,
                deferred: grouped.then(grouped::Deferred::new),
            },
        );
        let Some(staged) = staged else {
            return match shared? {
                Outcome::Queued(work) => self.enqueue_share(Share::Planned(work), &stream),
                Outcome::Deferred(plan) => self.enqueue_share(Share::Deferred(plan), &stream),
                Outcome::Enqueued | Outcome::Shared => Ok(()),
            };
        };
        let uploaded = match shared {
            Ok(Outcome::Shared) => staged.upload(&stream),
            Ok(Outcome::Enqueued) => Ok(()),
            // Staging ranks arrive only with idle streams, so their operations never queue
            // (and are never grouped: their devices are not host addressable).
            Ok(Outcome::Queued(_) | Outcome::Deferred(_)) => Err(Error::backend_message(
                "collectives",
                "internal error: a staged rank's operation was queued",
            )),
            Err(e) => Err(e),
        };
        self.shared.staging[self.rank]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(staged.into_buffers());
        uploaded
    }

    /// Whether `desc` takes the small path (`small.rs`): it fits the slots, and no
    /// override names an enqueued algorithm for it. The same on every rank.
    fn small_path(&self, desc: &OpDesc) -> bool {
        small::fits(desc, self.size())
            && matches!(
                self.shared.options.selector.forced(desc.kind, desc.bytes),
                None | Some(Algorithm::SharedMemory)
            )
    }

    /// Whether no override forces an algorithm other than shared memory for `desc`.
    fn may_share(&self, desc: &OpDesc) -> bool {
        matches!(
            self.shared.options.selector.forced(desc.kind, desc.bytes),
            None | Some(Algorithm::SharedMemory)
        )
    }

    /// Runs a small operation through the slots: now when the stream is idle (and the
    /// rank is not called in a group, where it must not wait for the others), else as a
    /// host function on the stream, in stream order.
    fn small(
        &self,
        slots: &Slots,
        seq: u64,
        desc: OpDesc,
        args: &Args<'_>,
        stream: &Stream,
        grouped: bool,
    ) -> Result<()> {
        let view = |s: &Option<BufferSlice<'_>>| match s {
            None => Some(None),
            Some(s) if s.len == 0 => Some(Some(HostRange::staged(
                std::ptr::NonNull::dangling().as_ptr(),
                0,
            ))),
            Some(s) => HostRange::of(s.allocation, s.offset, s.len).map(Some),
        };
        let host = match (view(&args.send), view(&args.recv)) {
            (Some(send), Some(recv)) => HostBuffers { send, recv },
            _ => {
                self.shared.announce(slots, self.rank, seq, None)?;
                return Err(Error::backend_message(
                    "collectives",
                    format!(
                        "internal error: memory of {} has no host view",
                        self.device().id()
                    ),
                ));
            }
        };
        let sh = &self.shared;
        if !grouped && sh.is_through(self.rank, seq) && matches!(stream.query(), Ok(true)) {
            let result = sh.exchange(slots, self.rank, seq, desc, &host);
            if result.is_ok() && self.rank == 0 {
                sh.ran_shared.fetch_add(1, Ordering::Relaxed);
            }
            return result;
        }
        let shared = self.shared.clone();
        let rank = self.rank;
        let skipped = self.shared.clone();
        let guard = SkipGuard::new(move || skipped.skipped(rank, seq));
        let armed = guard.armed();
        let exchange = move |_: &mut xpu_hal::HostKernelContext<'_>| {
            guard.ran();
            let Some(slots) = shared.slots.as_ref() else {
                return Err("internal error: the communicator has no slots".to_string());
            };
            let result = shared.exchange(slots, rank, seq, desc, &host);
            if result.is_ok() && rank == 0 {
                shared.ran_shared.fetch_add(1, Ordering::Relaxed);
            }
            result.map_err(|e| e.to_string())
        };
        let launched = self.launch_host_function(stream, "collective exchange", exchange, &armed);
        if launched.is_err() {
            sh.announce(slots, self.rank, seq, None)?;
        }
        launched
    }

    /// Publishes the description of operation `seq` (not a small one) from a host
    /// function on `stream`, once the rank is through with its earlier operations, one of
    /// which is still queued on another stream: the caller does not wait for it.
    fn announce_queued(
        &self,
        slots: &Slots,
        seq: u64,
        desc: OpDesc,
        stream: &Stream,
    ) -> Result<()> {
        let shared = self.shared.clone();
        let rank = self.rank;
        let skipped = self.shared.clone();
        let guard = SkipGuard::new(move || skipped.skipped(rank, seq));
        let armed = guard.armed();
        let announce = move |_: &mut xpu_hal::HostKernelContext<'_>| {
            guard.ran();
            let Some(slots) = shared.slots.as_ref() else {
                return Err("internal error: the communicator has no slots".to_string());
            };
            shared
                .announce(slots, rank, seq, Some(desc))
                .map_err(|e| e.to_string())
        };
        match self.launch_host_function(stream, "collective announce", announce, &armed) {
            Ok(()) => Ok(()),
            // Nothing was enqueued: publish from here, waiting as before.
            Err(_) => self.shared.announce(slots, self.rank, seq, Some(desc)),
        }
    }

    /// The CPU's view of the rank's buffers, when the device has one and the stream is
    /// idle, so that the data is ready now.
    fn host_buffers(
        &self,
        io: &RankIo,
        buffers: &RankBuffers,
        idle: bool,
        recv_is_input: bool,
        staged: &mut Option<Staged>,
    ) -> Option<HostBuffers> {
        if !io.device.capabilities().host_addressable {
            if !self.shared.may_stage[self.rank] || !idle {
                return None;
            }
            let mut pool = self.shared.staging[self.rank]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let (host, s) = staging::stage(&io.stream, buffers, recv_is_input, &mut pool)?;
            *staged = Some(s);
            return Some(host);
        }
        let view = |s: &Option<Slice>| match s {
            None => Some(None),
            Some(s) => HostRange::of(&s.alloc, s.offset, s.len).map(Some),
        };
        Some(HostBuffers {
            send: view(&buffers.send)?,
            recv: view(&buffers.recv)?,
        })
    }

    /// Enqueues this rank's share of a shared-memory operation on its stream, as a host
    /// function that runs when the stream gets there (`Work::participate_queued`) —
    /// for a rank called in a group, once the last rank has planned it (`grouped.rs`).
    fn enqueue_share(&self, share: Share, stream: &Stream) -> Result<()> {
        let skipped = share.clone();
        let guard = SkipGuard::new(move || skipped.give_up());
        let armed = guard.armed();
        let shared = self.shared.clone();
        let rank = self.rank;
        let given_up = share.clone();
        let run = move |_: &mut xpu_hal::HostKernelContext<'_>| {
            guard.ran();
            let deadline = Instant::now() + shared.options.timeout;
            let failed = |e: Error| {
                if matches!(e, Error::Timeout { .. }) {
                    shared.fail(e.clone());
                }
                e.to_string()
            };
            let work = match &share {
                Share::Planned(work) => work.clone(),
                Share::Deferred(plan) => plan
                    .wait(deadline, || shared.stopping().then(|| shared.failure()))
                    .map_err(failed)?,
            };
            work.participate_queued(rank, shared.spinner, deadline)
                .map_err(failed)
        };
        let launched = self.launch_host_function(stream, "collective share", run, &armed);
        if launched.is_err() {
            // The other ranks' shares must not wait for this one.
            given_up.give_up();
        }
        launched
    }

    /// Runs `f` on `stream`, in stream order, as a host function. `armed` is the flag
    /// of the [`SkipGuard`] `f` holds: it is cleared when nothing was enqueued (the
    /// caller then handles the failure itself), before `f` is dropped.
    fn launch_host_function(
        &self,
        stream: &Stream,
        name: &str,
        f: impl Fn(&mut xpu_hal::HostKernelContext<'_>) -> std::result::Result<(), String>
            + Send
            + Sync
            + 'static,
        armed: &AtomicBool,
    ) -> Result<()> {
        let source = xpu_hal::KernelSource::HostFunction(Arc::new(f));
        let launched = self
            .device()
            .load_kernel(xpu_hal::KernelDesc {
                name: name.to_string(),
                entry_point: name.to_string(),
                source: source.clone(),
                params: Vec::new(),
            })
            .and_then(|kernel| stream.launch(&kernel, xpu_hal::LaunchDims::linear(1, 1), &[]));
        if launched.is_err() {
            armed.store(false, Ordering::Release);
        }
        drop(source);
        launched
    }

    /// Every rank's `recv` becomes the reduction over ranks of their `send`. `send` and
    /// `recv` have the same length, a whole number of `dtype` elements; pass the same
    /// range for an in-place operation.
    pub fn all_reduce<'a, 'b>(
        &self,
        send: impl Into<BufferSlice<'a>>,
        recv: impl Into<BufferSlice<'b>>,
        dtype: DType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        if let Some(span) = self.span() {
            self.check_stream(stream)?;
            return self.span_all_reduce(span, send.into(), recv.into(), dtype, op, stream);
        }
        let (send, recv) = (send.into(), recv.into());
        self.arrive(stream, || {
            let (s, r) = check_all_reduce(self.device(), &send, &recv, dtype)?;
            Ok((
                OpDesc {
                    kind: Collective::AllReduce,
                    bytes: s.len,
                    dtype: Some(dtype),
                    op: Some(op),
                    root: None,
                },
                Args::both(s, r),
            ))
        })
    }

    /// The root's `recv` becomes the reduction over ranks of their `send`. `recv` is
    /// needed on the root only (others pass `None`).
    pub fn reduce<'a, 'b>(
        &self,
        send: impl Into<BufferSlice<'a>>,
        recv: Option<BufferSlice<'b>>,
        dtype: DType,
        op: ReduceOp,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        if let Some(span) = self.span() {
            self.check_stream(stream)?;
            return self.span_reduce(span, send.into(), recv, dtype, op, root, stream);
        }
        let send = send.into();
        self.arrive(stream, || {
            self.check_root(root)?;
            let s = check_slice(self.device(), &send, "send buffer")?;
            check_dtype(self.device(), s.len, dtype, "send buffer")?;
            let r = match (recv, self.rank == root) {
                (Some(b), true) => {
                    let r = check_slice(self.device(), &b, "receive buffer")?;
                    check_len(r.len, s.len, "receive buffer (the send buffer's length)")?;
                    check_aliasing(&s, &r)?;
                    Some(r)
                }
                (None, true) => {
                    return Err(Error::invalid(
                        "the root of a reduce needs a receive buffer",
                    ))
                }
                (_, false) => None,
            };
            Ok((
                OpDesc {
                    kind: Collective::Reduce,
                    bytes: s.len,
                    dtype: Some(dtype),
                    op: Some(op),
                    root: Some(root),
                },
                Args {
                    send: Some(s),
                    recv: r,
                },
            ))
        })
    }

    /// Every rank's `recv` becomes the root's data: the root's `send`, or its `recv` when
    /// it passes no `send` (in place). Other ranks pass `None` for `send`.
    pub fn broadcast<'a, 'b>(
        &self,
        send: Option<BufferSlice<'a>>,
        recv: impl Into<BufferSlice<'b>>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        if let Some(span) = self.span() {
            self.check_stream(stream)?;
            return self.span_broadcast(span, send, recv.into(), root, stream);
        }
        let recv = recv.into();
        self.arrive(stream, || {
            self.check_root(root)?;
            let r = check_slice(self.device(), &recv, "receive buffer")?;
            let s = match send {
                Some(b) if self.rank == root => {
                    let s = check_slice(self.device(), &b, "send buffer")?;
                    check_len(s.len, r.len, "send buffer (the receive buffer's length)")?;
                    check_aliasing(&s, &r)?;
                    Some(s)
                }
                _ => None,
            };
            Ok((
                OpDesc {
                    kind: Collective::Broadcast,
                    bytes: r.len,
                    dtype: None,
                    op: None,
                    root: Some(root),
                },
                Args {
                    send: s,
                    recv: Some(r),
                },
            ))
        })
    }

    /// Every rank's `recv` (size × `send`'s length) becomes all ranks' `send`, in rank
    /// order.
    pub fn all_gather<'a, 'b>(
        &self,
        send: impl Into<BufferSlice<'a>>,
        recv: impl Into<BufferSlice<'b>>,
        stream: &Stream,
    ) -> Result<()> {
        if let Some(span) = self.span() {
            self.check_stream(stream)?;
            return self.span_all_gather(span, send.into(), recv.into(), stream);
        }
        let (send, recv) = (send.into(), recv.into());
        self.arrive(stream, || {
            let s = check_slice(self.device(), &send, "send buffer")?;
            let r = check_slice(self.device(), &recv, "receive buffer")?;
            check_len(r.len, s.len * self.size() as u64, "receive buffer (ranks × the send buffer)")?;
            let own = r.sub(self.rank as u64 * s.len, s.len);
            if s.overlaps(&r) && !s.same_as(&own) {
                return Err(Error::invalid(
                    "the send buffer overlaps the receive buffer other than at this rank's own block; pass that block (in place) or disjoint ranges",
                ));
            }
            Ok((
                OpDesc {
                    kind: Collective::AllGather,
                    bytes: s.len,
                    dtype: None,
                    op: None,
                    root: None,
                },
                Args::both(s, r),
            ))
        })
    }

    /// Rank `r`'s `recv` becomes block `r` of the reduction over ranks of their `send`
    /// (size × `recv`'s length).
    pub fn reduce_scatter<'a, 'b>(
        &self,
        send: impl Into<BufferSlice<'a>>,
        recv: impl Into<BufferSlice<'b>>,
        dtype: DType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        if let Some(span) = self.span() {
            self.check_stream(stream)?;
            return self.span_reduce_scatter(span, send.into(), recv.into(), dtype, op, stream);
        }
        let (send, recv) = (send.into(), recv.into());
        self.arrive(stream, || {
            let s = check_slice(self.device(), &send, "send buffer")?;
            let r = check_slice(self.device(), &recv, "receive buffer")?;
            check_len(s.len, r.len * self.size() as u64, "send buffer (ranks × the receive buffer)")?;
            check_dtype(self.device(), r.len, dtype, "receive buffer")?;
            let own = s.sub(self.rank as u64 * r.len, r.len);
            if s.overlaps(&r) && !r.same_as(&own) {
                return Err(Error::invalid(
                    "the receive buffer overlaps the send buffer other than at this rank's own block; pass that block (in place) or disjoint ranges",
                ));
            }
            Ok((
                OpDesc {
                    kind: Collective::ReduceScatter,
                    bytes: r.len,
                    dtype: Some(dtype),
                    op: Some(op),
                    root: None,
                },
                Args::both(s, r),
            ))
        })
    }

    /// Block `q` of rank `r`'s `recv` becomes block `r` of rank `q`'s `send`; both are
    /// size × block bytes and must not overlap.
    pub fn all_to_all<'a, 'b>(
        &self,
        send: impl Into<BufferSlice<'a>>,
        recv: impl Into<BufferSlice<'b>>,
        stream: &Stream,
    ) -> Result<()> {
        if let Some(span) = self.span() {
            self.check_stream(stream)?;
            return self.span_all_to_all(span, send.into(), recv.into(), stream);
        }
        let (send, recv) = (send.into(), recv.into());
        self.arrive(stream, || {
            let s = check_slice(self.device(), &send, "send buffer")?;
            let r = check_slice(self.device(), &recv, "receive buffer")?;
            check_len(r.len, s.len, "receive buffer (the send buffer's length)")?;
            let n = self.size() as u64;
            if !s.len.is_multiple_of(n) {
                return Err(Error::invalid(format!(
                    "the send buffer is {} bytes, not {n} equal blocks",
                    s.len
                )));
            }
            if s.overlaps(&r) {
                return Err(Error::invalid(
                    "all-to-all cannot run in place; pass disjoint send and receive buffers",
                ));
            }
            Ok((
                OpDesc {
                    kind: Collective::AllToAll,
                    bytes: s.len / n,
                    dtype: None,
                    op: None,
                    root: None,
                },
                Args::both(s, r),
            ))
        })
    }

    /// Returns once every rank has called it; work each rank enqueues on `stream` after
    /// the barrier starts only when every rank's stream has reached it.
    pub fn barrier(&self, stream: &Stream) -> Result<()> {
        if let Some(span) = self.span() {
            self.check_stream(stream)?;
            return self.span_barrier(span, stream);
        }
        self.arrive(stream, || {
            Ok((
                OpDesc {
                    kind: Collective::Barrier,
                    bytes: 0,
                    dtype: None,
                    op: None,
                    root: None,
                },
                Args::NONE,
            ))
        })
    }

    fn check_root(&self, root: usize) -> Result<()> {
        if root >= self.size() {
            return Err(Error::invalid(format!(
                "root {root} is not a rank; the communicator has {} ranks",
                self.size()
            )));
        }
        Ok(())
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.size() || peer == self.rank {
            return Err(Error::invalid(format!(
                "peer {peer} is not another rank of this {}-rank communicator (this is rank {})",
                self.size(),
                self.rank
            )));
        }
        Ok(())
    }

    /// Sends `data` to rank `peer`: copies it into communicator memory on `stream` and
    /// returns; the matching [`Rank::recv`] delivers it.
    pub fn send<'a>(
        &self,
        data: impl Into<BufferSlice<'a>>,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        if let Some(span) = self.span() {
            self.check_stream(stream)?;
            return match self.span_peer(span, peer)? {
                Some(local) => self.here().send(data, local, stream),
                None => self.span_send(span, data.into(), peer, stream),
            };
        }
        let data = data.into();
        self.check_peer(peer)?;
        let io = self.io(stream)?;
        let s = check_slice(self.device(), &data, "send buffer")?;
        {
            let st = self.shared.lock();
            self.shared.check_failed(&st)?;
        }
        let copy: Allocation = self.device().allocate(s.len)?;
        let copy = Slice::whole(&copy);
        if s.len > 0 {
            io.stream.copy(s, copy.buf())?;
        }
        let ready = io.stream.record_event()?;
        let mut st = self.shared.lock();
        st.posted
            .entry((self.rank, peer))
            .or_default()
            .push_back(Posted { data: copy, ready });
        drop(st);
        self.shared.arrived.notify_all();
        Ok(())
    }

    /// Receives into `data` the oldest unmatched send from rank `peer`, waiting for it
    /// up to the communicator's timeout; the lengths must agree.
    pub fn recv<'a>(
        &self,
        data: impl Into<BufferSlice<'a>>,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        if let Some(span) = self.span() {
            self.check_stream(stream)?;
            return match self.span_peer(span, peer)? {
                Some(local) => self.here().recv(data, local, stream),
                None => self.span_recv(span, data.into(), peer, stream),
            };
        }
        let data = data.into();
        self.check_peer(peer)?;
        let io = self.io(stream)?;
        let d = check_slice(self.device(), &data, "receive buffer")?;
        let deadline = Instant::now() + self.shared.options.timeout;
        let mut st = self.shared.lock();
        let posted = loop {
            self.shared.check_failed(&st)?;
            if let Some(p) = st
                .posted
                .get_mut(&(peer, self.rank))
                .and_then(VecDeque::pop_front)
            {
                break p;
            }
            let now = Instant::now();
            if now >= deadline {
                let error = Error::Timeout {
                    message: format!(
                        "rank {} waited {:.1} s in recv for a send from {}, which never came; the communicator is now failed: abort it and make a new one",
                        self.rank,
                        self.shared.options.timeout.as_secs_f64(),
                        self.shared.rank_name(peer)
                    ),
                };
                self.shared.set_failed(&mut st, error.clone());
                drop(st);
                self.shared.arrived.notify_all();
                return Err(error);
            }
            st = self
                .shared
                .arrived
                .wait_timeout(st, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        };
        drop(st);
        if posted.data.len != d.len {
            return Err(Error::invalid(format!(
                "rank {} sent {} bytes but rank {} receives {}; post matching sizes",
                peer, posted.data.len, self.rank, d.len
            )));
        }
        if d.len == 0 {
            return Ok(());
        }
        // The transfer's sending side runs on the communicator's own stream of the
        // sender's device, ordered after the sender's copy by its event.
        let aux = self.shared.aux_stream(peer)?;
        aux.wait_event(&posted.ready)?;
        let ranks: Vec<RankIo> = (0..self.size())
            .map(|r| {
                if r == peer {
                    RankIo {
                        device: self.shared.devices[peer].clone(),
                        stream: aux.clone(),
                    }
                } else {
                    io.clone()
                }
            })
            .collect();
        let mut transport = self
            .shared
            .transport
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        transport.copy(
            &ranks,
            peer,
            &posted.data,
            self.rank,
            &Slice::from_buffer(&d),
        )
    }
}

/// Where a share queued on a stream finds its work.
#[derive(Clone)]
enum Share {
    /// Planned already.
    Planned(Arc<Work>),
    /// Planned by the last rank to arrive at an operation called in a group.
    Deferred(Arc<grouped::Deferred>),
}

impl Share {
    /// The share will not run: the other ranks' must not wait for it.
    fn give_up(&self) {
        match self {
            Share::Planned(work) => work.abandon(),
            Share::Deferred(plan) => plan.give_up(),
        }
    }
}

/// Held by a host function a rank enqueues: when the function is dropped without having
/// run — its stream skipped it because an earlier operation there failed — `on_skip`
/// tells the other ranks that this rank will not come, so that they fail now instead of
/// waiting for it until the communicator times out. Disarmed when the function was not
/// enqueued at all (its caller handles that).
struct SkipGuard<F: FnOnce() + Send> {
    armed: Arc<AtomicBool>,
    ran: AtomicBool,
    on_skip: std::sync::Mutex<Option<F>>,
}

impl<F: FnOnce() + Send> SkipGuard<F> {
    fn new(on_skip: F) -> Self {
        SkipGuard {
            armed: Arc::new(AtomicBool::new(true)),
            ran: AtomicBool::new(false),
            on_skip: std::sync::Mutex::new(Some(on_skip)),
        }
    }

    /// The flag that disarms it.
    fn armed(&self) -> Arc<AtomicBool> {
        self.armed.clone()
    }

    /// The function ran.
    fn ran(&self) {
        self.ran.store(true, Ordering::Release);
    }
}

impl<F: FnOnce() + Send> Drop for SkipGuard<F> {
    fn drop(&mut self) {
        if self.ran.load(Ordering::Acquire) || !self.armed.load(Ordering::Acquire) {
            return;
        }
        let on_skip = self
            .on_skip
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(f) = on_skip {
            f();
        }
    }
}
