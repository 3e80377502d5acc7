//! The step between processes: each process's leader holds its process's combined data
//! in host memory and exchanges it with the other leaders over [`Peers`].
//!
//! Reductions are direct: block `q` of every process's buffer goes to process `q`, which
//! combines the copies in process order; with two or more rounds (reduce-scatter, then
//! all-gather) for large all-reduces, one for small ones. Process order makes every
//! process's result the same bits. Each message carries the operation's header
//! ([`wire`]); a header that does not match what this process called is a desync.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use xpu_hal::{Error, Result};

use super::node_shm::{NodeShm, Posted, ShmFailure, SLOT};
use super::wire::{self, Header};
use super::{Incomplete, Peers, ProcessInfo};
use crate::comm::op::{OpDesc, ReduceOp};
use crate::comm::reduce_bytes;
use xpu_hal::shm::Stopped;

mod by_machine;

/// All-reduces of at most this many bytes exchange whole buffers in one round.
const ONE_ROUND: usize = 64 << 10;

/// Flags a process posts with its header in a step of [`Between::shm_swap`] (in the
/// sender's word, which the others do not compare): it has more to send after this
/// step; it wrote the same bytes for every process, once, at the start of its slot.
const MORE: u64 = 1 << 63;
const ONE_COPY: u64 = 1 << 62;

/// How a step between processes failed.
pub(crate) struct Failure {
    /// What to report.
    pub error: Error,
    /// Whether the transport may still use the step's buffers: then they must never be
    /// freed or reused.
    pub in_use: bool,
    /// The processes that did not take part in time, or whose transfer failed: what
    /// this process suspects of having failed.
    pub suspects: Vec<usize>,
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure {
            error,
            in_use: false,
            suspects: Vec::new(),
        }
    }
}

/// One operation's step between processes.
pub(crate) struct Between<'a> {
    /// The operation's input where it is not in the data yet: an out-of-place
    /// all-reduce's send buffer, read in place (copied into the data first where the
    /// step cannot read it there).
    pub input: Option<&'a [u8]>,
    /// The processes' shared memory, when they all run on one machine.
    pub shm: Option<&'a NodeShm>,
    pub peers: &'a dyn Peers,
    pub procs: &'a [ProcessInfo],
    /// The operation's number, the same in every process.
    pub seq: u64,
    /// The operation, with communicator ranks.
    pub desc: OpDesc,
    pub timeout: Duration,
    pub deadline: Instant,
    pub abort: &'a AtomicBool,
    /// Headers received, one per message received.
    pub heads: &'a mut Vec<Header>,
}

impl Between<'_> {
    fn me(&self) -> usize {
        self.peers.index()
    }

    fn others(&self) -> impl Iterator<Item = usize> {
        let me = self.me();
        (0..self.peers.count()).filter(move |&q| q != me)
    }

    fn name(&self, p: usize) -> String {
        super::process_name(self.procs, p)
    }

    /// Sends and receives the payloads, each behind the operation's header, and checks
    /// the headers received.
    fn swap(
        &mut self,
        sends: &[(usize, &[u8])],
        recvs: &mut [(usize, &mut [u8])],
    ) -> std::result::Result<(), Failure> {
        if let Some(shm) = self.shm {
            return self.shm_swap(shm, sends, recvs);
        }
        let out = wire::encode(self.seq, &self.desc, self.me());
        self.heads.clear();
        self.heads.resize(recvs.len(), [0; wire::WORDS]);
        let mut all_sends = Vec::with_capacity(sends.len() * 2);
        for (p, data) in sends {
            all_sends.push((*p, wire::bytes(&out)));
            all_sends.push((*p, *data));
        }
        let mut all_recvs = Vec::with_capacity(recvs.len() * 2);
        for ((p, data), head) in recvs.iter_mut().zip(self.heads.iter_mut()) {
            all_recvs.push((*p, wire::bytes_mut(head)));
            all_recvs.push((*p, &mut **data));
        }
        // Tags wrap; operations far enough apart never share one in flight.
        let tag = (self.seq % (1 << 20)) as u32;
        // SAFETY: on an error the buffers are reported in use (`Failure::in_use`), and
        // the communicator then leaks them (see `comm/span.rs`).
        let done = unsafe {
            self.peers
                .exchange(tag, &all_sends, &mut all_recvs, self.deadline, self.abort)
        };
        drop(all_recvs);
        let mismatch = recvs
            .iter()
            .zip(self.heads.iter())
            .find(|(_, h)| wire::decode(h) != Some((self.seq, self.desc)));
        match done {
            Ok(()) => {}
            Err(Incomplete::Failed { settled: true, .. }) if mismatch.is_some() => {}
            Err(e) => return Err(self.incomplete(e)),
        }
        if let Some(((p, _), h)) = mismatch {
            let theirs = match wire::decode(h) {
                Some((seq, d)) => format!("{d} as operation #{seq}"),
                None => "something that is not an xpu operation".to_string(),
            };
            return Err(Error::invalid(format!(
                "desync between processes: {} called {theirs}, but this process called {} as operation #{}; every process must call the same operations in the same order",
                self.name(*p),
                self.desc,
                self.seq
            ))
            .into());
        }
        Ok(())
    }

    fn incomplete(&self, e: Incomplete) -> Failure {
        let what = format!("{} (operation #{})", self.desc, self.seq);
        let suspects = match &e {
            Incomplete::Deadline { peers } => peers.clone(),
            Incomplete::Failed { peer, .. } => vec![*peer],
            Incomplete::Aborted { .. } | Incomplete::AbortedHere => Vec::new(),
        };
        let (error, in_use) = match e {
            Incomplete::Deadline { peers } => {
                let names: Vec<String> = peers.iter().map(|&p| self.name(p)).collect();
                (
                    Error::Timeout {
                        message: format!(
                            "{} did not take part in {what} within {:.1} s; the communicator is now failed: make a new one from the processes that remain (Communicator::shrink)",
                            names.join(" and "),
                            self.timeout.as_secs_f64()
                        ),
                    },
                    true,
                )
            }
            Incomplete::Aborted { by, why } => (
                Error::aborted(format!(
                    "{} gave up on the communicator during {what}: {}",
                    self.name(by),
                    why.says()
                )),
                true,
            ),
            Incomplete::AbortedHere => (
                Error::aborted(format!("the communicator was aborted during {what}")),
                true,
            ),
            Incomplete::Failed {
                peer,
                message,
                settled,
            } => (
                Error::backend_message(
                    "collectives",
                    format!(
                        "the transfer with {} failed during {what}: {message}",
                        self.name(peer)
                    ),
                ),
                !settled,
            ),
        };
        Failure {
            error,
            in_use,
            suspects,
        }
    }

    /// The operation's reduction as the processes combine partial results: a sum for
    /// averages (the caller divides at the end).
    fn combining(&self) -> OpDesc {
        let mut d = self.desc;
        if d.op == Some(ReduceOp::Avg) {
            d.op = Some(ReduceOp::Sum);
        }
        d
    }

    /// `dest` becomes the reduction of `len` bytes at each of `sources`, in process
    /// order.
    ///
    /// # Safety
    ///
    /// Every source must be valid for reads of `len` bytes that nothing writes during
    /// the call, aligned for the dtype; `dest` one of the sources or a disjoint range
    /// valid for writes of `len` bytes.
    unsafe fn reduce(&self, sources: &[*mut u8], dest: *mut u8, len: usize) -> Result<()> {
        // SAFETY: the caller's contract, which is `reduce_bytes`'s.
        unsafe { reduce_bytes(&self.combining(), self.peers.count(), sources, dest, len) }
    }

    /// Every process's `data` becomes the reduction of all processes' `data` — or of
    /// their [`Between::input`], where they have one; `extra` holds at least
    /// `(processes - 1) × data.len()` bytes where the processes share no memory.
    pub fn all_reduce(
        &mut self,
        data: &mut [u8],
        extra: &mut [u8],
        elem: usize,
    ) -> std::result::Result<(), Failure> {
        let n = self.peers.count();
        let len = data.len();
        let input = self.input.take();
        if input.is_some_and(|i| i.len() != len) {
            return Err(Error::backend_message(
                "collectives",
                "internal error: an all-reduce's input and data differ in length",
            )
            .into());
        }
        if let Some(shm) = self.shm.filter(|_| n > 1) {
            return self.shm_all_reduce(shm, input, data);
        }
        if let Some(input) = input {
            data.copy_from_slice(input);
        }
        if n == 1 {
            return Ok(());
        }
        if len == 0 {
            return Ok(());
        }
        let small = len <= ONE_ROUND || len / elem < n;
        if let Some(machines) = self.machines() {
            return if small {
                self.all_reduce_by_machine(data, extra, &machines)
            } else {
                self.large_all_reduce_by_machine(data, extra, elem, &machines)
            };
        }
        if small {
            let others: Vec<usize> = self.others().collect();
            let mut recvs = from_others(&others, extra, len)?;
            self.swap(
                &others.iter().map(|&q| (q, &*data)).collect::<Vec<_>>(),
                &mut recvs,
            )?;
            let mut sources: Vec<*mut u8> = recvs.iter_mut().map(|(_, b)| b.as_mut_ptr()).collect();
            let own = data.as_mut_ptr();
            sources.insert(self.me(), own);
            // SAFETY: every source is `len` live bytes (this process's buffer, or a chunk
            // of `extra` that received as much), aligned (host buffers are page aligned,
            // chunks a whole number of elements), and only the reduction touches them;
            // the destination is this process's own source.
            unsafe { self.reduce(&sources, own, len) }?;
            return Ok(());
        }
        let blocks = even_blocks(len, elem, n);
        self.reduce_scatter(data, extra, &blocks)?;
        self.all_gather(data, &blocks)
    }

    /// The all-reduce in shared memory: in steps of at most a slot, each process copies
    /// its chunk into its slot and reduces every process's, in process order, into its
    /// own data.
    fn shm_all_reduce(
        &mut self,
        shm: &NodeShm,
        input: Option<&[u8]>,
        data: &mut [u8],
    ) -> std::result::Result<(), Failure> {
        let me = self.me();
        let n = self.peers.count();
        let len = data.len();
        let words = wire::encode(self.seq, &self.desc, me);
        let cancel = || self.abort.load(std::sync::atomic::Ordering::Acquire);
        let base = data.as_mut_ptr();
        let mut lo = 0;
        loop {
            let chunk = SLOT.min(len - lo);
            // SAFETY: `lo + chunk` is within `data` (and `input`, as long).
            let at = unsafe { base.add(lo) };
            // This process's chunk: in its input, or already in its data.
            let mine = input.map_or(at.cast_const(), |i| i[lo..].as_ptr());
            let fill = |slot: *mut u8| {
                // SAFETY: this process's slot holds SLOT ≥ chunk bytes and is free
                // (every process is done with the step that used it last); `mine` is
                // `chunk` bytes of `input` or `data`, which nothing else touches during
                // the step.
                unsafe { std::ptr::copy_nonoverlapping(mine, slot, chunk) };
            };
            let read = |posted: &Posted<'_>| -> Result<()> {
                if chunk == 0 {
                    return Ok(());
                }
                let sources: Vec<*mut u8> = (0..n)
                    .map(|q| {
                        if q == me {
                            mine.cast_mut()
                        } else {
                            posted.slot(q).cast_mut()
                        }
                    })
                    .collect();
                // SAFETY: every other process's slot holds its `chunk` bytes, posted for
                // this step and written by no one until this process is done with it;
                // slots are 64-byte aligned, and `mine` and `at` are `input` or `data`
                // (host buffers, aligned) plus a whole number of slots; the destination
                // is this process's own source or, with an input, a range disjoint from
                // every source; the reduction only reads the sources.
                unsafe { self.reduce(&sources, at, chunk) }
            };
            shm.step(&words, self.deadline, &cancel, fill, read)
                .map_err(|e| self.shm_failure(e))?;
            lo += chunk;
            if lo >= len {
                return Ok(());
            }
        }
    }

    /// [`Between::swap`] through the processes' shared memory, in steps: at each, every
    /// process writes the next part of its sends into its slot — once, at the start, when
    /// it sends the same bytes to every process it sends to; else the part for process
    /// `q` at `q`'s share of the slot (one per other process) — posts whether it has more
    /// after this step, and reads the parts for it from the senders' slots. Steps go on
    /// while any process posted that it has more, so every process takes the same steps.
    fn shm_swap(
        &mut self,
        shm: &NodeShm,
        sends: &[(usize, &[u8])],
        recvs: &mut [(usize, &mut [u8])],
    ) -> std::result::Result<(), Failure> {
        let me = self.me();
        let n = shm.parties();
        // Each destination's share of a slot, in whole cache lines: a sender's slot holds
        // one per other process, in process order.
        let share = (SLOT / (n - 1).max(1)) & !63;
        let share_of = |from: usize, to: usize| (to - usize::from(to > from)) * share;
        let peers = sends
            .iter()
            .map(|(q, _)| *q)
            .chain(recvs.iter().map(|(q, _)| *q));
        if let Some(q) = peers.into_iter().find(|&q| q == me || q >= n) {
            return Err(Error::backend_message(
                "collectives",
                format!("internal error: process {me} exchanges with process {q} of {n}"),
            )
            .into());
        }
        if share == 0 {
            return Err(Error::invalid(format!(
                "{n} processes share too small a slot ({SLOT} bytes) to exchange through shared memory; set XPU_COLL_SHM=off"
            ))
            .into());
        }
        let one_copy = sends.first().is_some_and(|(_, d)| {
            sends
                .iter()
                .all(|(_, e)| e.as_ptr() == d.as_ptr() && e.len() == d.len())
        });
        let chunk = if one_copy { SLOT } else { share };
        let longest = sends.iter().map(|(_, d)| d.len()).max().unwrap_or(0);
        let cancel = || self.abort.load(std::sync::atomic::Ordering::Acquire);
        // What each source has delivered to this process so far.
        let mut got = vec![0usize; recvs.len()];
        let mut sent = 0usize;
        loop {
            let more = longest > sent + chunk;
            let mut words = wire::encode(self.seq, &self.desc, me);
            words[7] |= if more { MORE } else { 0 } | if one_copy { ONE_COPY } else { 0 };
            let fill = |slot: *mut u8| {
                for (q, data) in sends {
                    let at = if one_copy { 0 } else { share_of(me, *q) };
                    let part = &data[sent.min(data.len())..(sent + chunk).min(data.len())];
                    // SAFETY: this process's slot holds SLOT bytes and is free (every
                    // process is done with the step that used it last); `at + part.len()`
                    // is within it (a whole slot at 0, or `share` bytes at one of the
                    // n − 1 shares).
                    unsafe {
                        std::ptr::copy_nonoverlapping(part.as_ptr(), slot.add(at), part.len())
                    };
                    if one_copy {
                        break;
                    }
                }
            };
            let mut again = more;
            let read = |posted: &Posted<'_>| -> Result<()> {
                for q in (0..n).filter(|&q| q != me) {
                    again |= posted.words(q)[7] & MORE != 0;
                }
                for ((p, data), got) in recvs.iter_mut().zip(got.iter_mut()) {
                    let theirs = posted.words(*p)[7];
                    let (at, chunk) = match theirs & ONE_COPY != 0 {
                        true => (0, SLOT),
                        false => (share_of(*p, me), share),
                    };
                    let take = chunk.min(data.len() - *got);
                    // SAFETY: process `p` posted this step, and no one writes its slot
                    // until this process is done with the step; `at + take` is within
                    // the slot as above.
                    let part = unsafe { std::slice::from_raw_parts(posted.slot(*p).add(at), take) };
                    data[*got..*got + take].copy_from_slice(part);
                    *got += take;
                }
                Ok(())
            };
            shm.step(&words, self.deadline, &cancel, fill, read)
                .map_err(|e| self.shm_failure(e))?;
            // `again` was set by `read`, which ran inside the step.
            if !again {
                break;
            }
            sent += chunk;
        }
        if let Some(((p, data), got)) = recvs.iter().zip(&got).find(|((_, d), g)| **g != d.len()) {
            return Err(Error::invalid(format!(
                "{} sent {got} bytes where this process expected {} in {} (operation #{}); every process must call the same operations with the same sizes",
                self.name(*p),
                data.len(),
                self.desc,
                self.seq
            ))
            .into());
        }
        Ok(())
    }

    /// The failure of a step in shared memory.
    fn shm_failure(&self, e: ShmFailure) -> Failure {
        let what = format!("{} (operation #{})", self.desc, self.seq);
        match e {
            ShmFailure::Stopped(Stopped::Deadline(missing)) => {
                let mut f = self.incomplete(Incomplete::Deadline { peers: missing });
                // Nothing of the transport's holds the buffers.
                f.in_use = false;
                f
            }
            ShmFailure::Stopped(Stopped::Broken {
                party,
                why,
                missing,
            }) => {
                let missing: Vec<usize> = missing.into_iter().filter(|&q| q != party).collect();
                let late = if missing.is_empty() {
                    String::new()
                } else {
                    let names: Vec<String> = missing.iter().map(|&q| self.name(q)).collect();
                    format!(" ({} had not come)", names.join(" and "))
                };
                Failure {
                    error: Error::aborted(format!(
                        "{} gave up on the communicator during {what}: {}{late}",
                        self.name(party),
                        super::GiveUp::from_code(why).says()
                    )),
                    in_use: false,
                    suspects: missing,
                }
            }
            ShmFailure::Stopped(Stopped::Cancelled) => Failure {
                error: Error::aborted(format!("the communicator was aborted during {what}")),
                in_use: false,
                suspects: Vec::new(),
            },
            ShmFailure::Differs(q, theirs) => {
                let theirs = match wire::decode(&theirs) {
                    Some((seq, d)) => format!("{d} as operation #{seq}"),
                    None => "something that is not an xpu operation".to_string(),
                };
                Error::invalid(format!(
                    "desync between processes: {} called {theirs}, but this process called {} as operation #{}; every process must call the same operations in the same order",
                    self.name(q),
                    self.desc,
                    self.seq
                ))
                .into()
            }
            ShmFailure::Failed(e) => e.into(),
        }
    }

    /// Block `q` of `data` (`blocks[q]`) at process `q` becomes the reduction of every
    /// process's block `q`; `extra` holds `(processes - 1) ×` the largest block.
    pub fn reduce_scatter(
        &mut self,
        data: &mut [u8],
        extra: &mut [u8],
        blocks: &[(usize, usize)],
    ) -> std::result::Result<(), Failure> {
        if data.len() > ONE_ROUND {
            if let Some(machines) = self.machines().filter(|g| even(g)) {
                return self.reduce_scatter_by_machine(data, extra, blocks, &machines);
            }
        }
        let all: Vec<usize> = (0..self.peers.count()).collect();
        self.reduce_scatter_among(&all, data, extra, blocks)
    }

    /// Among the processes of `group` (this one among them), block `i` of `data`
    /// (`blocks[i]`) at `group[i]` becomes the reduction of the group's blocks `i`, in
    /// group order; `extra` holds `(group.len() - 1) ×` this process's block.
    fn reduce_scatter_among(
        &mut self,
        group: &[usize],
        data: &mut [u8],
        extra: &mut [u8],
        blocks: &[(usize, usize)],
    ) -> std::result::Result<(), Failure> {
        let at = self.place_in(group, blocks.len())?;
        let (off, len) = blocks[at];
        let others: Vec<usize> = group.iter().copied().filter(|&q| q != group[at]).collect();
        let sends: Vec<(usize, &[u8])> = group
            .iter()
            .zip(blocks)
            .filter(|(&q, _)| q != group[at])
            .map(|(&q, &(o, l))| (q, &data[o..o + l]))
            .collect();
        let mut recvs = from_others(&others, extra, len)?;
        self.swap(&sends, &mut recvs)?;
        let mut sources: Vec<*mut u8> = recvs.iter_mut().map(|(_, b)| b.as_mut_ptr()).collect();
        let own = data[off..off + len].as_mut_ptr();
        sources.insert(at, own);
        // SAFETY: as in `all_reduce`: live, aligned, `len`-byte sources (the block
        // starts at an element boundary), and the destination is this process's own.
        unsafe { self.reduce(&sources, own, len) }?;
        Ok(())
    }

    /// Every process's `data` gets every process's block `q` (`blocks[q]`) from process `q`.
    pub fn all_gather(
        &mut self,
        data: &mut [u8],
        blocks: &[(usize, usize)],
    ) -> std::result::Result<(), Failure> {
        if data.len() > ONE_ROUND {
            if let Some(machines) = self.machines().filter(|g| even(g)) {
                return self.all_gather_by_machine(data, blocks, &machines);
            }
        }
        let all: Vec<usize> = (0..self.peers.count()).collect();
        self.all_gather_among(&all, data, blocks)
    }

    /// Among the processes of `group` (this one among them), every one's `data` gets
    /// block `i` (`blocks[i]`) from `group[i]`.
    fn all_gather_among(
        &mut self,
        group: &[usize],
        data: &mut [u8],
        blocks: &[(usize, usize)],
    ) -> std::result::Result<(), Failure> {
        let at = self.place_in(group, blocks.len())?;
        let mut parts = split_blocks(data, blocks)?;
        let own = std::mem::take(&mut parts[at]);
        let sends: Vec<(usize, &[u8])> = group
            .iter()
            .filter(|&&q| q != group[at])
            .map(|&q| (q, &*own))
            .collect();
        let mut recvs: Vec<(usize, &mut [u8])> = group
            .iter()
            .copied()
            .zip(parts)
            .enumerate()
            .filter(|(i, _)| *i != at)
            .map(|(_, p)| p)
            .collect();
        self.swap(&sends, &mut recvs)
    }

    /// Where this process stands in `group`, which has one block per process.
    fn place_in(&self, group: &[usize], blocks: usize) -> Result<usize> {
        let me = self.me();
        match group.iter().position(|&q| q == me) {
            Some(at) if group.len() == blocks => Ok(at),
            _ => Err(Error::backend_message(
                "collectives",
                "internal error: a step between processes without this process or with a block per process missing",
            )),
        }
    }

    /// Process `root`'s `data` becomes the reduction of every process's `data`; `extra`
    /// holds `(processes - 1) × data.len()` bytes at the root, and on several machines
    /// `(processes on this machine - 1) × data.len()` elsewhere.
    pub fn reduce_to(
        &mut self,
        data: &mut [u8],
        extra: &mut [u8],
        root: usize,
    ) -> std::result::Result<(), Failure> {
        if let Some(machines) = self.machines() {
            return self.reduce_by_machine(data, extra, root, &machines);
        }
        let len = data.len();
        if self.me() != root {
            return self.swap(&[(root, &*data)], &mut []);
        }
        let others: Vec<usize> = self.others().collect();
        let mut recvs = from_others(&others, extra, len)?;
        self.swap(&[], &mut recvs)?;
        let mut sources: Vec<*mut u8> = recvs.iter_mut().map(|(_, b)| b.as_mut_ptr()).collect();
        let own = data.as_mut_ptr();
        sources.insert(root, own);
        // SAFETY: as in `all_reduce`.
        unsafe { self.reduce(&sources, own, len) }?;
        Ok(())
    }

    /// Every process's `data` becomes process `root`'s.
    pub fn broadcast(&mut self, data: &mut [u8], root: usize) -> std::result::Result<(), Failure> {
        if data.len() > ONE_ROUND {
            if let Some(machines) = self.machines() {
                return self.broadcast_by_machine(data, root, &machines);
            }
        }
        if self.me() == root {
            let sends: Vec<(usize, &[u8])> = self.others().map(|q| (q, &*data)).collect();
            self.swap(&sends, &mut [])
        } else {
            self.swap(&[], &mut [(root, data)])
        }
    }

    /// Block `q` of `input` (`out_blocks[q]`) goes to process `q`, and block `q` of
    /// `output` (`in_blocks[q]`) comes from process `q`.
    pub fn all_to_all(
        &mut self,
        input: &[u8],
        out_blocks: &[(usize, usize)],
        output: &mut [u8],
        in_blocks: &[(usize, usize)],
    ) -> std::result::Result<(), Failure> {
        let me = self.me();
        let block = |b: &[(usize, usize)], q: usize| b[q].0..b[q].0 + b[q].1;
        let sends: Vec<(usize, &[u8])> = self
            .others()
            .map(|q| (q, &input[block(out_blocks, q)]))
            .collect();
        let mut parts = split_blocks(output, in_blocks)?;
        parts[me].copy_from_slice(&input[block(out_blocks, me)]);
        let mut recvs: Vec<(usize, &mut [u8])> = parts
            .into_iter()
            .enumerate()
            .filter(|(q, _)| *q != me)
            .collect();
        self.swap(&sends, &mut recvs)
    }

    /// Returns once every process has reached the barrier.
    pub fn barrier(&mut self) -> std::result::Result<(), Failure> {
        let others: Vec<usize> = self.others().collect();
        let sends: Vec<(usize, &[u8])> = others.iter().map(|&q| (q, &[][..])).collect();
        let mut recvs: Vec<(usize, &mut [u8])> = others.iter().map(|&q| (q, &mut [][..])).collect();
        self.swap(&sends, &mut recvs)
    }
}

/// Where each of `others` sends its `len` bytes: consecutive chunks of `extra`, which
/// must hold them all.
fn from_others<'a>(
    others: &[usize],
    extra: &'a mut [u8],
    len: usize,
) -> Result<Vec<(usize, &'a mut [u8])>> {
    let Some(need) = others.len().checked_mul(len).filter(|&n| n <= extra.len()) else {
        return Err(Error::backend_message(
            "collectives",
            "internal error: the scratch for other processes' data is too small",
        ));
    };
    let mut rest = &mut extra[..need];
    let mut out = Vec::with_capacity(others.len());
    for &q in others {
        let (chunk, tail) = std::mem::take(&mut rest).split_at_mut(len);
        out.push((q, chunk));
        rest = tail;
    }
    Ok(out)
}

/// `len` bytes cut into `n` blocks of whole `elem`-byte elements, as even as they go.
pub(crate) fn even_blocks(len: usize, elem: usize, n: usize) -> Vec<(usize, usize)> {
    let count = len / elem;
    let (each, rest) = (count / n, count % n);
    let mut at = 0;
    (0..n)
        .map(|q| {
            let k = (each + usize::from(q < rest)) * elem;
            let b = (at, k);
            at += k;
            b
        })
        .collect()
}

/// `data` cut at `blocks`, which must be disjoint and within it (in any order): the
/// parts in the order of `blocks`.
fn split_blocks<'a>(data: &'a mut [u8], blocks: &[(usize, usize)]) -> Result<Vec<&'a mut [u8]>> {
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    order.sort_by_key(|&i| blocks[i]);
    let mut parts: Vec<Option<&'a mut [u8]>> = blocks.iter().map(|_| None).collect();
    let mut rest = data;
    let mut at = 0;
    for i in order {
        let (off, len) = blocks[i];
        let skip = off.checked_sub(at).filter(|s| s + len <= rest.len());
        let Some(skip) = skip else {
            return Err(Error::backend_message(
                "collectives",
                "internal error: blocks between processes overlap or lie out of range",
            ));
        };
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(skip);
        let (part, tail) = tail.split_at_mut(len);
        parts[i] = Some(part);
        rest = tail;
        at = off + len;
    }
    Ok(parts.into_iter().flatten().collect())
}

/// Whether every machine holds as many processes.
fn even(machines: &[Vec<usize>]) -> bool {
    machines.windows(2).all(|w| w[0].len() == w[1].len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_blocks_cover_the_buffer_in_whole_elements() {
        assert_eq!(even_blocks(40, 4, 3), vec![(0, 16), (16, 12), (28, 12)]);
        assert_eq!(even_blocks(8, 4, 3), vec![(0, 4), (4, 4), (8, 0)]);
    }

    #[test]
    fn split_blocks_refuses_overlaps() {
        let mut data = [0u8; 10];
        assert!(split_blocks(&mut data, &[(0, 4), (2, 4)]).is_err());
        let parts = split_blocks(&mut data, &[(0, 4), (6, 4)]).map(|p| p.len());
        assert!(matches!(parts, Ok(2)));
        let parts = split_blocks(&mut data, &[(6, 3), (0, 4), (4, 2)]).unwrap();
        let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
        assert_eq!(lens, [3, 4, 2]);
        assert!(split_blocks(&mut data, &[(6, 4), (0, 7)]).is_err());
        assert!(split_blocks(&mut data, &[(8, 4)]).is_err());
    }
}
