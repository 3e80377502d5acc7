//! Operations of a communicator that spans processes (see [`crate::process`]): the
//! process's ranks combine their data at a leader with the in-process algorithms, the
//! leaders exchange between processes, and each leader hands the result back.
//!
//! The in-process steps go through [`Rank::here`], the same rank on the process's own
//! communicator, which checks each rank's arguments as an in-process call does. The
//! leader's step stages its data through host buffers of the span's own ([`Scratch`]);
//! when an exchange between processes fails in a way that leaves those buffers to the
//! transport, they are leaked rather than freed under it.

use xpu_hal::HostBuffer;

use super::args::{check_all_reduce, check_len, check_slice, Range};
use super::*;
use crate::process::between::{Between, Failure};
use crate::process::wire::Header;
use std::sync::atomic::AtomicU32;

use crate::process::{
    process_name, swap_with_all, GiveUp, Incomplete, Peers, ProcessInfo, SETUP_TAG, SHRINK_TAGS,
};

/// The first tag of point-to-point messages between processes (collectives use the
/// tags below 2^20, communicator set-up and aborts those just above 2^21).
const P2P_TAGS: u32 = 1 << 22;

/// A communicator's processes, and this process's place among them.
pub(crate) struct Span {
    pub peers: Box<dyn Peers>,
    pub procs: Vec<ProcessInfo>,
    /// This process's index.
    pub me: usize,
    /// Ranks in all processes.
    pub size: usize,
    pub timeout: Duration,
    /// Per local rank: the number of its next operation.
    pub seqs: Vec<CachePadded<AtomicU64>>,
    pub scratch: Mutex<Scratch>,
    pub aborted: AtomicBool,
    /// Per process: whether this process suspects it of having failed (it did not take
    /// part in time, or a transfer with it failed).
    pub suspects: Mutex<Vec<bool>>,
    /// Every process's devices and the links between them (`across_topology.rs`).
    pub topology: Mutex<Topology>,
    /// Shrinks started from this communicator (each uses its own tags).
    pub shrinks: AtomicU32,
    /// The devices' own library over every process's ranks, when it spans them
    /// (`native_across.rs`).
    pub native: Option<super::native_across::NativeAcross>,
    /// The processes' step exchange in shared memory, when they all run on one machine
    /// (`process/node_shm.rs`).
    pub shm: Option<crate::process::node_shm::NodeShm>,
}

/// The leader's host buffers.
#[derive(Default)]
pub(crate) struct Scratch {
    data: Option<HostBuffer>,
    extra: Option<HostBuffer>,
    heads: Vec<Header>,
}

/// A host buffer of at least `len` bytes, reusing `slot`'s.
fn at_least(slot: &mut Option<HostBuffer>, len: usize) -> Result<&mut HostBuffer> {
    if slot.as_ref().is_none_or(|b| b.len() < len) {
        let grown = slot.as_ref().map_or(0, |b| b.len().saturating_mul(2));
        *slot = Some(HostBuffer::new(len.max(grown).max(64))?);
    }
    slot.as_mut()
        .ok_or_else(|| Error::backend_message("collectives", "internal error: no scratch"))
}

impl Span {
    /// Tells the other processes that this one gave up on the communicator, and why:
    /// over the transport, and in the shared memory where there is one.
    pub(super) fn give_up(&self, why: GiveUp) {
        if let Some(shm) = &self.shm {
            shm.give_up(why);
        }
        self.peers.abort_others(why);
    }

    fn me(&self) -> &ProcessInfo {
        &self.procs[self.me]
    }

    /// Records that `processes` did not take part in time or failed a transfer.
    fn suspect(&self, processes: &[usize]) {
        let mut suspects = self.suspects.lock().unwrap_or_else(|p| p.into_inner());
        for &p in processes {
            if let Some(s) = suspects.get_mut(p) {
                *s = true;
            }
        }
    }

    /// The process holding global rank `rank`, and the rank's index there.
    fn locate(&self, rank: usize) -> Result<(usize, usize)> {
        self.procs
            .iter()
            .find(|p| (p.first_rank..p.first_rank + p.ranks()).contains(&rank))
            .map(|p| (p.index, rank - p.first_rank))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "rank {rank} is not a rank; the communicator has {} ranks",
                    self.size
                ))
            })
    }

    /// Byte ranges of each process's ranks' blocks of `unit` bytes.
    fn process_blocks(&self, unit: usize) -> Vec<(usize, usize)> {
        self.procs
            .iter()
            .map(|p| (p.first_rank * unit, p.ranks() * unit))
            .collect()
    }
}

/// What the leader's step stages in and out: device ranges and their offsets in `data`.
struct Stage<'s> {
    /// A range `data` bytes long that the exchange may work in itself, when the CPU
    /// can reach it.
    home: Option<BufferSlice<'s>>,
    fill: Vec<(BufferSlice<'s>, usize)>,
    drain: Vec<(usize, BufferSlice<'s>)>,
    data: usize,
    extra: usize,
    /// The operation's input where the exchange may read it in place rather than have
    /// it filled into `data` (an out-of-place all-reduce's send buffer): with the stream
    /// idle and the slice the CPU's, it is not filled, and the exchange gets its bytes.
    source: Option<BufferSlice<'s>>,
}

/// The CPU's view of a slice: its address and length, and the view that keeps the
/// memory alive (forgotten, so never freed, when the transport may still use it).
struct View {
    view: xpu_hal::HostView,
    ptr: *mut u8,
    len: usize,
}

/// The CPU's view of `slice`, when its memory has one and the slice lies within the
/// allocation.
fn view_of(slice: &BufferSlice<'_>) -> Option<View> {
    let view = slice.allocation.host_view()?;
    let end = slice.offset.checked_add(slice.len)?;
    if end > view.len() {
        return None;
    }
    let len = usize::try_from(slice.len).ok()?;
    let at = usize::try_from(slice.offset).ok()?;
    // In bounds, as checked above.
    let ptr = view.as_ptr().wrapping_add(at);
    Some(View { view, ptr, len })
}

/// The leader's scratch copy of the data, where the step made one.
fn scratch_of<'b>(data: &'b mut Option<&mut HostBuffer>) -> Result<&'b mut HostBuffer> {
    data.as_deref_mut()
        .ok_or_else(|| Error::backend_message("collectives", "internal error: no scratch data"))
}

fn usize_of(n: u64) -> Result<usize> {
    usize::try_from(n)
        .map_err(|_| Error::invalid("the operation does not fit this platform's sizes"))
}

impl Rank {
    /// The span this rank's communicator has, when it crosses processes.
    pub(super) fn span(&self) -> Option<&Arc<Span>> {
        self.span.as_ref()
    }

    /// The same rank on this process's own communicator.
    pub(super) fn here(&self) -> Rank {
        Rank {
            shared: self.shared.clone(),
            rank: self.rank,
            span: None,
        }
    }

    /// The local index of `peer` when it is a rank of this process; `None` when it is
    /// another process's.
    pub(super) fn span_peer(&self, span: &Span, peer: usize) -> Result<Option<usize>> {
        if peer == self.rank() {
            return Err(Error::invalid(format!(
                "peer {peer} is this rank; send to and receive from another rank"
            )));
        }
        let (p, l) = span.locate(peer)?;
        Ok((p == span.me).then_some(l))
    }

    /// The tag of messages from rank `from` to rank `to` (the pair, modulo 2048 ranks).
    fn pair_tag(from: usize, to: usize) -> u32 {
        P2P_TAGS + ((from % 2048) * 2048 + to % 2048) as u32
    }

    /// Sends to a rank of another process: waits for `stream` to reach the data, then
    /// hands a copy to the transport and returns.
    pub(super) fn span_send(
        &self,
        span: &Span,
        data: BufferSlice<'_>,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        let d = check_slice(self.device(), &data, "send buffer")?;
        {
            let st = self.shared.lock();
            self.shared.check_failed(&st)?;
        }
        let bytes = stream.read(d)?;
        let (process, _) = span.locate(peer)?;
        span.peers
            .post(Self::pair_tag(self.rank(), peer), process, bytes)
            .map_err(|e| self.p2p_failure(span, e, peer, "send to"))
    }

    /// Receives from a rank of another process the oldest unmatched send, waiting for it
    /// up to the communicator's timeout; the lengths must agree.
    pub(super) fn span_recv(
        &self,
        span: &Span,
        data: BufferSlice<'_>,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        let d = check_slice(self.device(), &data, "receive buffer")?;
        {
            let st = self.shared.lock();
            self.shared.check_failed(&st)?;
        }
        let mut bytes = vec![0u8; usize_of(d.len)?];
        let (process, _) = span.locate(peer)?;
        let deadline = Instant::now() + span.timeout;
        span.peers
            .receive(
                Self::pair_tag(peer, self.rank()),
                process,
                &mut bytes,
                deadline,
                &span.aborted,
            )
            .map_err(|e| self.p2p_failure(span, e, peer, "receive from"))?;
        stream.write(d, &bytes)
    }

    /// The error of a failed transfer with `peer`; a transfer that may still be in
    /// flight fails the communicator.
    fn p2p_failure(&self, span: &Span, e: Incomplete, peer: usize, what: &str) -> Error {
        let (process, _) = span.locate(peer).unwrap_or((0, 0));
        if matches!(e, Incomplete::Deadline { .. } | Incomplete::Failed { .. }) {
            span.suspect(&[process]);
        }
        let name = process_name(&span.procs, process);
        let error = match e {
            Incomplete::Deadline { .. } => Error::Timeout {
                message: format!(
                    "rank {} waited {:.1} s to {what} rank {peer} in {name}, which never came; the communicator is now failed: make a new one",
                    self.rank(),
                    span.timeout.as_secs_f64()
                ),
            },
            Incomplete::Aborted { by, why } => Error::aborted(format!(
                "{} gave up on the communicator: {}",
                process_name(&span.procs, by),
                why.says()
            )),
            Incomplete::AbortedHere => Error::aborted("the communicator was aborted"),
            Incomplete::Failed { message, .. } => Error::invalid(format!(
                "the transfer to {what} rank {peer} in {name} failed: {message}; post a send and a receive of the same length"
            )),
        };
        self.shared.fail(error.clone());
        error
    }

    fn local_size(&self) -> usize {
        self.shared.devices.len()
    }

    /// Runs the leader's step of operation `desc` (global ranks) on `stream`.
    fn lead(
        &self,
        span: &Span,
        seq: u64,
        desc: OpDesc,
        stream: &Stream,
        stage: Stage<'_>,
        exchange: impl FnOnce(
            &mut Between<'_>,
            &mut [u8],
            &mut [u8],
        ) -> std::result::Result<(), Failure>,
    ) -> Result<()> {
        let mut scratch = span.scratch.lock().unwrap_or_else(|p| p.into_inner());
        // With the stream idle and every range the CPU's, the leader copies itself, and
        // the exchange works in the home range itself where there is one; otherwise the
        // stream copies through the scratch buffers, and the leader waits for it.
        let direct = matches!(stream.query(), Ok(true))
            && stage
                .fill
                .iter()
                .map(|(s, _)| s)
                .chain(stage.drain.iter().map(|(_, s)| s))
                .chain(stage.home.iter())
                .all(|s| view_of(s).is_some());
        let home = stage
            .home
            .filter(|_| direct)
            .and_then(|h| view_of(&h).map(|v| (h, v)))
            .filter(|(_, v)| v.len == stage.data);
        let result = (|| -> std::result::Result<(), Failure> {
            {
                let st = self.shared.lock();
                self.shared.check_failed(&st)?;
            }
            // Whether `slice` is the home range's bytes at `off` already.
            let at_home = |slice: &BufferSlice<'_>, off: usize| {
                home.as_ref().is_some_and(|(h, _)| {
                    slice.allocation.id() == h.allocation.id()
                        && slice.offset.checked_sub(h.offset) == Some(off as u64)
                })
            };
            // The input the exchange reads in place, when it is not the home range.
            let input = stage
                .source
                .filter(|src| home.is_some() && !at_home(src, 0))
                .and_then(|src| view_of(&src).map(|v| (src, v)))
                .filter(|(_, v)| v.len == stage.data);
            let is_input = |slice: &BufferSlice<'_>, off: usize| {
                off == 0
                    && input.as_ref().is_some_and(|(src, _)| {
                        slice.allocation.id() == src.allocation.id()
                            && slice.offset == src.offset
                            && slice.len == src.len
                    })
            };
            let s = &mut *scratch;
            // The scratch copy of the data, only where the exchange cannot work in the
            // home range itself.
            let mut data = match home {
                Some(_) => None,
                None => Some(at_least(&mut s.data, stage.data)?),
            };
            let region = match &home {
                Some((_, v)) => v.ptr,
                None => scratch_of(&mut data)?.as_mut_slice()?.as_mut_ptr(),
            };
            for (slice, off) in &stage.fill {
                if at_home(slice, *off) || is_input(slice, *off) {
                    continue;
                }
                match direct.then(|| view_of(slice)).flatten() {
                    Some(v) if off + v.len <= stage.data => {
                        // SAFETY: the view covers the slice's `len` bytes of live memory
                        // (checked in `view_of`) that no enqueued work touches (the
                        // stream is idle); the region holds `stage.data` bytes, and
                        // `off + len` is within them.
                        unsafe { std::ptr::copy(v.ptr, region.add(*off), v.len) };
                    }
                    _ => stream.copy_to_host(*slice, scratch_of(&mut data)?, *off as u64)?,
                }
            }
            if !direct {
                stream.synchronize()?;
            }
            let extra = at_least(&mut s.extra, stage.extra)?;
            let data_bytes: &mut [u8] = match &home {
                // SAFETY: the home range's `stage.data` bytes of live memory, which
                // nothing else touches during the step (the stream is idle, and the
                // caller's other ranks wait for this step).
                Some((_, v)) => unsafe { std::slice::from_raw_parts_mut(v.ptr, v.len) },
                None => &mut scratch_of(&mut data)?.as_mut_slice()?[..stage.data],
            };
            let mut between = Between {
                // SAFETY: the view covers the source's `len` bytes of live memory (checked
                // in `view_of`), which nothing writes during the step (the stream is
                // idle, and it is not the home range the exchange writes).
                input: input
                    .as_ref()
                    .map(|(_, v)| unsafe { std::slice::from_raw_parts(v.ptr.cast_const(), v.len) }),
                shm: span.shm.as_ref(),
                peers: &*span.peers,
                procs: &span.procs,
                seq,
                desc,
                timeout: span.timeout,
                deadline: Instant::now() + span.timeout,
                abort: &span.aborted,
                heads: &mut s.heads,
            };
            exchange(
                &mut between,
                data_bytes,
                &mut extra.as_mut_slice()?[..stage.extra],
            )?;
            for (off, slice) in &stage.drain {
                if at_home(slice, *off) {
                    continue;
                }
                match direct.then(|| view_of(slice)).flatten() {
                    Some(v) if off + v.len <= stage.data => {
                        // SAFETY: as for the fill (nothing was enqueued since).
                        unsafe { std::ptr::copy(region.add(*off), v.ptr, v.len) };
                    }
                    _ => stream.copy_from_host(scratch_of(&mut data)?, *off as u64, *slice)?,
                }
            }
            if !direct {
                stream.synchronize()?;
            }
            Ok(())
        })();
        let Err(failure) = result else {
            return Ok(());
        };
        if failure.in_use {
            // The transport may still write them: never free them.
            std::mem::forget(std::mem::take(&mut *scratch));
            if let Some((_, v)) = home {
                std::mem::forget(v.view);
            }
        }
        drop(scratch);
        span.suspect(&failure.suspects);
        // The other processes learn of it at once rather than at their deadline, and
        // none goes on with messages this process sent before it gave up.
        let why = match &failure.error {
            Error::Aborted { .. } => None,
            Error::Timeout { .. } => Some(GiveUp::Timeout),
            Error::InvalidArgument { .. } => Some(GiveUp::Desync),
            _ => Some(GiveUp::Failed),
        };
        if let Some(why) = why {
            span.give_up(why);
        }
        self.shared.fail(failure.error.clone());
        Err(failure.error)
    }

    /// This rank's next operation number across processes.
    fn next_seq(&self, span: &Span) -> u64 {
        span.seqs[self.rank].fetch_add(1, Ordering::Relaxed)
    }

    /// A failure in this process's own step, which the other processes must hear of.
    pub(super) fn failed_here(&self, span: &Span, error: Error) -> Error {
        span.give_up(match error {
            Error::InvalidArgument { .. } => GiveUp::Refused,
            _ => GiveUp::Failed,
        });
        self.shared.fail(error.clone());
        error
    }

    pub(super) fn span_all_reduce(
        &self,
        span: &Span,
        send: BufferSlice<'_>,
        recv: BufferSlice<'_>,
        dtype: DType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        let seq = self.next_seq(span);
        let call = super::span_native::Call::AllReduce {
            send,
            recv,
            dtype,
            op,
        };
        if let Some(done) = self.span_native(span, seq, call, stream) {
            return done;
        }
        let local_op = if op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        };
        let here = self.here();
        let leader = self.rank == 0;
        let alone = self.local_size() == 1;
        if alone {
            // The only rank here: its send buffer goes into the exchange as it is.
            check_all_reduce(self.device(), &send, &recv, dtype)
                .map_err(|e| self.failed_here(span, e))?;
        } else {
            here.reduce(send, leader.then_some(recv), dtype, local_op, 0, stream)
                .map_err(|e| self.failed_here(span, e))?;
        }
        if leader {
            let len = usize_of(recv.len)?;
            let desc = OpDesc {
                kind: Collective::AllReduce,
                bytes: recv.len,
                dtype: Some(dtype),
                op: Some(op),
                root: None,
            };
            let n = span.procs.len();
            let stage = Stage {
                home: Some(recv),
                fill: vec![(if alone { send } else { recv }, 0)],
                drain: vec![(0, recv)],
                data: len,
                // The all-reduce in shared memory needs no room for the others' data.
                extra: if span.shm.is_some() { 0 } else { len * (n - 1) },
                source: alone.then_some(send),
            };
            let size = span.size;
            self.lead(span, seq, desc, stream, stage, |b, data, extra| {
                b.all_reduce(data, extra, dtype.size())?;
                finish_avg(&desc, size, data)
            })?;
        }
        if self.local_size() > 1 {
            here.broadcast(None, recv, 0, stream)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn span_reduce(
        &self,
        span: &Span,
        send: BufferSlice<'_>,
        recv: Option<BufferSlice<'_>>,
        dtype: DType,
        op: ReduceOp,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let seq = self.next_seq(span);
        let call = super::span_native::Call::Reduce {
            send,
            recv,
            dtype,
            op,
            root,
        };
        if let Some(done) = self.span_native(span, seq, call, stream) {
            return done;
        }
        let (root_process, local_root) = span.locate(root)?;
        let at_root = root_process == span.me;
        let leader_rank = if at_root { local_root } else { 0 };
        let leader = self.rank == leader_rank;
        let local_op = if op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        };
        // Outside the root's process the leader reduces into a buffer of its own.
        let temp = if leader && !at_root {
            Some(self.device().allocate(send.len)?)
        } else {
            None
        };
        let target = match &temp {
            Some(t) => Some(t.whole()),
            None if leader => recv,
            None => None,
        };
        let here = self.here();
        here.reduce(send, target, dtype, local_op, leader_rank, stream)
            .map_err(|e| self.failed_here(span, e))?;
        if !leader {
            return Ok(());
        }
        let Some(target) = target else {
            return Err(Error::invalid(
                "the root of a reduce needs a receive buffer",
            ));
        };
        let len = usize_of(send.len)?;
        let desc = OpDesc {
            kind: Collective::Reduce,
            bytes: send.len,
            dtype: Some(dtype),
            op: Some(op),
            root: Some(root),
        };
        let stage = Stage {
            home: Some(target),
            fill: vec![(target, 0)],
            drain: if at_root {
                vec![(0, target)]
            } else {
                Vec::new()
            },
            data: len,
            // Grouped by machine, the process where a machine's data meets receives
            // from the others of its machine.
            extra: if at_root {
                len * (span.procs.len() - 1)
            } else {
                let host = &span.me().host;
                len * (span.procs.iter().filter(|p| &p.host == host).count() - 1)
            },
            source: None,
        };
        let size = span.size;
        self.lead(span, seq, desc, stream, stage, |b, data, extra| {
            b.reduce_to(data, extra, root_process)?;
            if at_root {
                finish_avg(&desc, size, data)?;
            }
            Ok(())
        })
    }

    pub(super) fn span_broadcast(
        &self,
        span: &Span,
        send: Option<BufferSlice<'_>>,
        recv: BufferSlice<'_>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let seq = self.next_seq(span);
        let call = super::span_native::Call::Broadcast { send, recv, root };
        if let Some(done) = self.span_native(span, seq, call, stream) {
            return done;
        }
        let (root_process, local_root) = span.locate(root)?;
        let at_root = root_process == span.me;
        let leader_rank = if at_root { local_root } else { 0 };
        let here = self.here();
        let send = if self.rank == leader_rank && at_root {
            send
        } else {
            None
        };
        if at_root {
            // The root's process first: every rank there gets the data, then the
            // leader (the root) passes it on.
            here.broadcast(send, recv, leader_rank, stream)
                .map_err(|e| self.failed_here(span, e))?;
        }
        if self.rank == leader_rank {
            let desc = OpDesc {
                kind: Collective::Broadcast,
                bytes: recv.len,
                dtype: None,
                op: None,
                root: Some(root),
            };
            let len = usize_of(recv.len)?;
            let stage = Stage {
                home: Some(recv),
                fill: if at_root { vec![(recv, 0)] } else { Vec::new() },
                drain: if at_root { Vec::new() } else { vec![(0, recv)] },
                data: len,
                extra: 0,
                source: None,
            };
            self.lead(span, seq, desc, stream, stage, |b, data, _| {
                b.broadcast(data, root_process)
            })?;
        }
        if !at_root {
            here.broadcast(None, recv, leader_rank, stream)?;
        }
        Ok(())
    }

    pub(super) fn span_all_gather(
        &self,
        span: &Span,
        send: BufferSlice<'_>,
        recv: BufferSlice<'_>,
        stream: &Stream,
    ) -> Result<()> {
        let seq = self.next_seq(span);
        let call = super::span_native::Call::AllGather { send, recv };
        if let Some(done) = self.span_native(span, seq, call, stream) {
            return done;
        }
        let unit = send.len;
        check_len(
            recv.len,
            unit * span.size as u64,
            "receive buffer (ranks × the send buffer)",
        )
        .map_err(|e| self.failed_here(span, e))?;
        let first = span.me().first_rank as u64;
        let local = self.local_size() as u64;
        let mine = recv.sub(first * unit, local * unit);
        let here = self.here();
        here.all_gather(send, mine, stream)
            .map_err(|e| self.failed_here(span, e))?;
        if self.rank == 0 {
            let desc = OpDesc {
                kind: Collective::AllGather,
                bytes: unit,
                dtype: None,
                op: None,
                root: None,
            };
            let unit = usize_of(unit)?;
            let blocks = span.process_blocks(unit);
            let stage = Stage {
                home: Some(recv),
                fill: vec![(mine, blocks[span.me].0)],
                drain: vec![(0, recv)],
                data: unit * span.size,
                extra: 0,
                source: None,
            };
            self.lead(span, seq, desc, stream, stage, |b, data, _| {
                b.all_gather(data, &blocks)
            })?;
        }
        if self.local_size() > 1 {
            here.broadcast(None, recv, 0, stream)?;
        }
        Ok(())
    }

    pub(super) fn span_reduce_scatter(
        &self,
        span: &Span,
        send: BufferSlice<'_>,
        recv: BufferSlice<'_>,
        dtype: DType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        let seq = self.next_seq(span);
        let call = super::span_native::Call::ReduceScatter {
            send,
            recv,
            dtype,
            op,
        };
        if let Some(done) = self.span_native(span, seq, call, stream) {
            return done;
        }
        let unit = recv.len;
        check_len(
            send.len,
            unit * span.size as u64,
            "send buffer (ranks × the receive buffer)",
        )
        .map_err(|e| self.failed_here(span, e))?;
        let local = self.local_size();
        let here = self.here();
        let local_op = if op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        };
        let leader = self.rank == 0;
        // With other ranks in the process, the leader reduces theirs into a buffer of its
        // own and sends each its block afterwards.
        let temp = if leader && local > 1 {
            Some(self.device().allocate(send.len)?)
        } else {
            None
        };
        if local > 1 {
            here.reduce(
                send,
                temp.as_ref().map(|t| t.whole()),
                dtype,
                local_op,
                0,
                stream,
            )
            .map_err(|e| self.failed_here(span, e))?;
        }
        if !leader {
            return here.recv(recv, 0, stream);
        }
        let desc = OpDesc {
            kind: Collective::ReduceScatter,
            bytes: unit,
            dtype: Some(dtype),
            op: Some(op),
            root: None,
        };
        let unit = usize_of(unit)?;
        let blocks = span.process_blocks(unit);
        let (off, _) = blocks[span.me];
        let source = temp.as_ref().map_or(send, |t| t.whole());
        let mut drain = vec![(off, recv)];
        if let Some(t) = &temp {
            for l in 1..local {
                drain.push((off + l * unit, t.slice((l * unit) as u64, unit as u64)));
            }
        }
        let stage = Stage {
            home: None,
            fill: vec![(source, 0)],
            drain,
            data: unit * span.size,
            extra: blocks.iter().map(|b| b.1).max().unwrap_or(0) * (span.procs.len() - 1),
            source: None,
        };
        let size = span.size;
        self.lead(span, seq, desc, stream, stage, |b, data, extra| {
            b.reduce_scatter(data, extra, &blocks)?;
            let (o, l) = blocks[b.peers.index()];
            finish_avg(&desc, size, &mut data[o..o + l])
        })?;
        hand_out(&here, temp.as_ref(), unit, stream)
    }

    pub(super) fn span_all_to_all(
        &self,
        span: &Span,
        send: BufferSlice<'_>,
        recv: BufferSlice<'_>,
        stream: &Stream,
    ) -> Result<()> {
        let seq = self.next_seq(span);
        let call = super::span_native::Call::AllToAll { send, recv };
        if let Some(done) = self.span_native(span, seq, call, stream) {
            return done;
        }
        let n = span.size as u64;
        let checked = check_len(
            recv.len,
            send.len,
            "receive buffer (the send buffer's length)",
        )
        .and_then(|()| {
            if send.len.is_multiple_of(n) {
                Ok(())
            } else {
                Err(Error::invalid(format!(
                    "the send buffer is {} bytes, not {n} equal blocks",
                    send.len
                )))
            }
        })
        .and_then(|()| {
            if send.overlaps(&recv) {
                Err(Error::invalid(
                    "all-to-all cannot run in place; pass disjoint send and receive buffers",
                ))
            } else {
                Ok(())
            }
        });
        checked.map_err(|e| self.failed_here(span, e))?;
        let here = self.here();
        let local = self.local_size();
        if self.rank != 0 {
            here.send(send, 0, stream)?;
            return here.recv(recv, 0, stream);
        }
        let row = usize_of(send.len)?;
        let unit = row / span.size;
        // The process's rows, by local rank, gathered on the leader's device.
        let temp = if local > 1 {
            Some(self.device().allocate(send.len * local as u64)?)
        } else {
            None
        };
        let mut fill = vec![(send, 0)];
        if let Some(t) = &temp {
            for l in 1..local {
                let part = t.slice((l * row) as u64, row as u64);
                here.recv(part, l, stream)?;
                fill.push((part, l * row));
            }
        }
        let mut drain = vec![(0, recv)];
        if let Some(t) = &temp {
            for l in 1..local {
                drain.push((l * row, t.slice((l * row) as u64, row as u64)));
            }
        }
        let desc = OpDesc {
            kind: Collective::AllToAll,
            bytes: unit as u64,
            dtype: None,
            op: None,
            root: None,
        };
        let total = local * row;
        let stage = Stage {
            home: None,
            fill,
            drain,
            data: total,
            extra: 2 * total,
            source: None,
        };
        let procs = span.procs.clone();
        self.lead(span, seq, desc, stream, stage, |b, data, extra| {
            let (out, inn) = extra.split_at_mut(total);
            // Out to process p: [local source l][p's rank q'], from data's [l][q].
            let mut out_blocks = Vec::with_capacity(procs.len());
            let mut at = 0;
            for p in &procs {
                let start = at;
                for l in 0..local {
                    let from = (l * span.size + p.first_rank) * unit;
                    let k = p.ranks() * unit;
                    out[at..at + k].copy_from_slice(&data[from..from + k]);
                    at += k;
                }
                out_blocks.push((start, at - start));
            }
            // In from process p: [p's source l''][local destination l].
            let in_blocks: Vec<(usize, usize)> = procs
                .iter()
                .map(|p| (p.first_rank * local * unit, p.ranks() * local * unit))
                .collect();
            b.all_to_all(out, &out_blocks, inn, &in_blocks)?;
            // Each local rank's row of results, by global source, back into data.
            for p in &procs {
                for s in 0..p.ranks() {
                    for l in 0..local {
                        let from = (p.first_rank * local + s * local + l) * unit;
                        let to = (l * span.size + p.first_rank + s) * unit;
                        data[to..to + unit].copy_from_slice(&inn[from..from + unit]);
                    }
                }
            }
            Ok(())
        })?;
        hand_out(&here, temp.as_ref(), row, stream)
    }

    pub(super) fn span_barrier(&self, span: &Span, stream: &Stream) -> Result<()> {
        let seq = self.next_seq(span);
        let here = self.here();
        let local = self.local_size();
        if local > 1 {
            here.barrier(stream)
                .map_err(|e| self.failed_here(span, e))?;
        }
        if self.rank == 0 {
            let desc = OpDesc {
                kind: Collective::Barrier,
                bytes: 0,
                dtype: None,
                op: None,
                root: None,
            };
            let stage = Stage {
                home: None,
                fill: Vec::new(),
                drain: Vec::new(),
                data: 0,
                extra: 0,
                source: None,
            };
            self.lead(span, seq, desc, stream, stage, |b, _, _| b.barrier())?;
        }
        if local > 1 {
            here.barrier(stream)?;
        }
        Ok(())
    }
}

/// The leader's last step where each local rank gets its own block: block `l` of
/// `temp` (`unit` bytes each) goes to local rank `l`, for every rank but the leader's.
fn hand_out(here: &Rank, temp: Option<&Allocation>, unit: usize, stream: &Stream) -> Result<()> {
    let Some(t) = temp else {
        return Ok(());
    };
    for l in 1..here.local_size() {
        here.send(t.slice((l * unit) as u64, unit as u64), l, stream)?;
    }
    // The blocks are copied out on the stream before `temp` is freed.
    stream.synchronize()
}

/// Divides a finished sum over `size` ranks in place, for [`ReduceOp::Avg`].
fn finish_avg(desc: &OpDesc, size: usize, data: &mut [u8]) -> std::result::Result<(), Failure> {
    if desc.op != Some(ReduceOp::Avg) || data.is_empty() {
        return Ok(());
    }
    let ptr = data.as_mut_ptr();
    // SAFETY: one source that is also the destination: `data`, live, exclusively
    // borrowed and aligned for the dtype (page-aligned host buffers, blocks at element
    // boundaries).
    unsafe { reduce_bytes(desc, size, &[ptr], ptr, data.len()) }?;
    Ok(())
}

/// What each process tells the others when a communicator across processes is formed.
#[derive(serde::Serialize, serde::Deserialize)]
struct Joining {
    host: String,
    pid: u32,
    devices: Vec<String>,
    /// The devices as the topology describes them.
    #[serde(default)]
    topo: Vec<crate::topology::TopoDevice>,
    /// The devices' backend, when its own collective library spans processes.
    #[serde(default)]
    native: Option<String>,
    /// Whether the process would share memory with the others of its machine.
    #[serde(default)]
    shm: bool,
    /// The cores the process may run on (empty where its system does not say).
    #[serde(default)]
    cores: Vec<u32>,
}

impl Communicator {
    /// One communicator over the devices of every process of `MPI_COMM_WORLD`: each
    /// process passes its own devices (its ranks are consecutive, in process order), and
    /// every process must make it, in the same order. Waits at most the options' timeout
    /// for the others.
    ///
    /// The operations are those of an in-process communicator, called by every rank of
    /// every process; point-to-point transfers run between ranks of one process.
    #[cfg(feature = "mpi")]
    pub fn from_mpi(
        mpi: &crate::process::mpi::Mpi,
        devices: Vec<Device>,
        options: CommOptions,
    ) -> Result<Communicator> {
        options.validate()?;
        let peers = mpi.peers(options.timeout)?;
        // The machine this process runs on, as the others group it: MPI's processor
        // name unless XPU_NODE_NAME says otherwise (containers whose host names differ
        // on one machine, or processes meant to stand for separate machines).
        let host = std::env::var("XPU_NODE_NAME")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| mpi.host().to_string());
        Self::across(Box::new(peers), host, SETUP_TAG, devices, options)
    }

    /// After a failure of this communicator across processes, a new one over the
    /// processes that remain: the processes this one found failed (they did not take
    /// part in time, or a transfer with them failed) are left out, and the survivors
    /// agree on who they are before they form it — so a job can go on with fewer ranks.
    ///
    /// Every surviving process calls it once the failure has reached it (an operation
    /// returned its error); each keeps its devices, and the ranks are numbered afresh in
    /// process order. The survivors first exchange what each suspects, then confirm the
    /// union; a process that answers neither round within the timeout is left out too.
    /// When the survivors' views still differ, or this process is among the failed, the
    /// call fails and nothing is formed.
    ///
    /// A communicator within one process has no processes to leave out: make a new one
    /// with [`Communicator::new`] over the devices that still work.
    pub fn shrink(&self) -> Result<Communicator> {
        let Some(span) = &self.span else {
            return Err(Error::invalid(
                "shrink applies to a communicator across processes; within one process make a new one with Communicator::new over the devices that still work",
            ));
        };
        let n = span.procs.len();
        let me = span.me;
        let epoch = span.shrinks.fetch_add(1, Ordering::Relaxed);
        let mut suspects = span
            .suspects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let names = |set: &[bool]| -> String {
            let named: Vec<String> = (0..n)
                .filter(|&q| set[q])
                .map(|q| span.procs[q].describe())
                .collect();
            if named.is_empty() {
                "none".to_string()
            } else {
                named.join(", ")
            }
        };
        // Round 0: each tells the others what it suspects, and takes the union. Round
        // 1: each tells the union; every survivor must hold the same.
        for round in 0..2u32 {
            let tag = SHRINK_TAGS.saturating_add(epoch.saturating_mul(2).saturating_add(round));
            let with: Vec<usize> = (0..n).filter(|&q| q != me && !suspects[q]).collect();
            let mine: Vec<u8> = suspects.iter().map(|&s| u8::from(s)).collect();
            let deadline = Instant::now() + span.timeout;
            // In the first round, a process another survivor found failed is not
            // waited for.
            let mut heard = suspects.clone();
            let mut arrived = |_: usize, theirs: &[u8]| -> Vec<usize> {
                if round > 0 {
                    return Vec::new();
                }
                let mut newly = Vec::new();
                for (q, (h, &t)) in heard.iter_mut().zip(theirs).enumerate() {
                    if t != 0 && !*h {
                        *h = true;
                        newly.push(q);
                    }
                }
                newly
            };
            let got = span
                .peers
                .swap_after_failure(tag, &mine, &with, deadline, &mut arrived);
            let mut differ = Vec::new();
            for (&q, theirs) in with.iter().zip(got) {
                match theirs {
                    // Found failed by another survivor, or silent in time.
                    None if heard[q] => suspects[q] = true,
                    None => {
                        suspects[q] = true;
                        differ.push(q);
                    }
                    Some(theirs) => {
                        if theirs != mine {
                            differ.push(q);
                        }
                        for (s, t) in suspects.iter_mut().zip(theirs) {
                            *s |= t != 0;
                        }
                    }
                }
            }
            if suspects[me] {
                return Err(Error::aborted(format!(
                    "the other processes count this process ({}) among the failed; it cannot join the communicator they form",
                    span.procs[me].describe()
                )));
            }
            if round == 1 && !differ.is_empty() {
                let differ: Vec<String> =
                    differ.iter().map(|&q| span.procs[q].describe()).collect();
                return Err(Error::Timeout {
                    message: format!(
                        "the processes that remain could not agree on which failed within {:.1} s ({} answered otherwise; failed here: {}); end the job and start it again from a checkpoint",
                        span.timeout.as_secs_f64(),
                        differ.join(", "),
                        names(&suspects)
                    ),
                });
            }
        }
        let keep: Vec<usize> = (0..n).filter(|&q| !suspects[q]).collect();
        let peers = span.peers.subset(&keep)?;
        tracing::info!(
            "shrinking a communicator across {n} processes to {}: left out {}",
            keep.len(),
            names(&suspects)
        );
        Communicator::across(
            peers,
            span.procs[me].host.clone(),
            SETUP_TAG,
            self.shared.devices.clone(),
            self.shared.options.clone(),
        )
    }

    /// A communicator over `devices` and the other processes' reached through `peers`.
    fn across(
        peers: Box<dyn Peers>,
        host: String,
        tag: u32,
        devices: Vec<Device>,
        options: CommOptions,
    ) -> Result<Communicator> {
        options.validate()?;
        let me = peers.index();
        let n = peers.count();
        let joining = Joining {
            host,
            pid: std::process::id(),
            devices: devices.iter().map(|d| d.id().to_string()).collect(),
            topo: devices
                .iter()
                .map(crate::topology::TopoDevice::from_device)
                .collect(),
            native: super::native_across::offer(&devices),
            shm: crate::process::node_shm::willing(),
            cores: crate::process::cores::allowed(),
        };
        let mine = serde_json::to_vec(&joining)
            .map_err(|e| Error::backend_message("collectives", format!("internal error: {e}")))?;
        let deadline = Instant::now() + options.timeout;
        let joined = |what: &str, e: crate::process::Incomplete| -> Error {
            Error::Timeout {
                message: format!(
                    "forming a communicator across {n} processes failed while exchanging {what}: {e:?}; every process must make the communicator, in the same order, within {:.1} s",
                    options.timeout.as_secs_f64()
                ),
            }
        };
        // Lengths first, then each process's description.
        let my_len = (mine.len() as u64).to_le_bytes().to_vec();
        let lens = swap_with_all(&*peers, tag, my_len, vec![8; n], deadline)
            .map_err(|e| joined("their sizes", e))?;
        let mut sizes = Vec::with_capacity(n);
        for (q, len) in lens.iter().enumerate() {
            let bytes: [u8; 8] = len.as_slice().try_into().unwrap_or([0; 8]);
            let len = usize::try_from(u64::from_le_bytes(bytes)).unwrap_or(usize::MAX);
            if q != me && len > 1 << 20 {
                return Err(Error::invalid(format!(
                    "process {q} described itself in {len} bytes; is it running the same program?"
                )));
            }
            sizes.push(if q == me { 0 } else { len });
        }
        let theirs = swap_with_all(&*peers, tag, mine, sizes, deadline)
            .map_err(|e| joined("their devices", e))?;
        let mut procs = Vec::with_capacity(n);
        let mut topo = Vec::with_capacity(n);
        let mut offers = Vec::with_capacity(n);
        let mut willing = Vec::with_capacity(n);
        let mut cores = Vec::with_capacity(n);
        let mut first = 0;
        for (q, bytes) in theirs.iter().enumerate() {
            let j: Joining = if q == me {
                Joining {
                    host: joining.host.clone(),
                    pid: joining.pid,
                    devices: joining.devices.clone(),
                    topo: joining.topo.clone(),
                    native: joining.native.clone(),
                    shm: joining.shm,
                    cores: joining.cores.clone(),
                }
            } else {
                serde_json::from_slice(bytes).map_err(|e| {
                    Error::invalid(format!(
                        "process {q} sent a description this process cannot read ({e}); run the same build of the program in every process"
                    ))
                })?
            };
            if j.topo.len() != j.devices.len() {
                return Err(Error::invalid(format!(
                    "process {q} described {} devices but {} of their topology; run the same build of the program in every process",
                    j.devices.len(),
                    j.topo.len()
                )));
            }
            topo.push(j.topo);
            offers.push(j.native);
            willing.push(j.shm);
            cores.push(j.cores);
            procs.push(ProcessInfo {
                index: q,
                host: j.host,
                pid: j.pid,
                first_rank: first,
                devices: j.devices,
            });
            first += procs[q].ranks();
        }
        if let Some(empty) = procs.iter().find(|p| p.devices.is_empty()) {
            return Err(Error::invalid(format!(
                "{} contributes no device to the communicator; select at least one device in every process",
                empty.describe()
            )));
        }
        // Within the process, a rank waits a second longer than the step between
        // processes, so that a process that never comes is reported by name.
        let mut local_options = options.clone();
        local_options.timeout = options.timeout + Duration::from_secs(1);
        let local = Communicator::new(devices, local_options)?;
        let local_ranks = local.shared.devices.len();
        // Whether this machine's processes can each have a core: how long their waits
        // spin before they yield.
        let neighbours: Vec<Vec<u32>> = procs
            .iter()
            .zip(cores)
            .filter(|(p, _)| p.host == procs[me].host)
            .map(|(_, c)| c)
            .collect();
        let fitting = crate::process::cores::each_has_one(&neighbours);
        peers.set_fitting(fitting);
        let shm = crate::process::node_shm::NodeShm::form(
            &*peers,
            &procs,
            &willing,
            fitting,
            options.timeout,
            &joined,
        )?;
        let native = super::native_across::NativeAcross::form(
            &*peers,
            &offers,
            &local.shared.devices,
            procs[me].first_rank,
            first,
            options.timeout,
            &joined,
        )?;
        let topology = super::across_topology::global(&local.shared.topology, &procs, topo);
        Ok(Communicator {
            shared: local.shared,
            span: Some(Arc::new(Span {
                peers,
                procs,
                me,
                size: first,
                timeout: options.timeout,
                seqs: (0..local_ranks)
                    .map(|_| CachePadded::new(AtomicU64::new(0)))
                    .collect(),
                scratch: Mutex::new(Scratch::default()),
                aborted: AtomicBool::new(false),
                suspects: Mutex::new(vec![false; n]),
                shrinks: AtomicU32::new(0),
                topology: Mutex::new(topology),
                native,
                shm,
            })),
        })
    }
}
