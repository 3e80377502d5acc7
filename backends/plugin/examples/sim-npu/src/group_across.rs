//! `simccl` across processes (ABI 1.4): groups whose ranks live in several processes,
//! meeting in a step exchange in POSIX shared memory ([`xpu_hal::shm`]), as a vendor
//! library's communicators meet over the machine's links.
//!
//! [`group_id`] names a fresh segment; every process joins it with its ranks
//! ([`SimGroupAcross::join`]), and the name is removed once all have joined, so nothing
//! is left behind. An operation runs in steps, each moving at most a slot of every
//! rank's data; every process numbers the steps alike, because every process enqueues
//! the same operations in the same order and cuts them alike. A rank's part is a job on
//! its stream. In step `s` it waits until every rank is done with step `s − 1` (so its
//! slot is free), copies what it contributes into its slot, posts `s` with a word
//! describing the operation, waits for the ranks it needs to post `s` (a different word
//! is a desync), writes its result from their slots in rank order with the same
//! arithmetic as the in-process groups ([`crate::group::write_result`]), and marks
//! itself done with `s`.
//!
//! Failures: a part whose peers do not post within the group's timeout fails with
//! `Timeout`, naming the ranks and their processes; a part that fails, never runs or is
//! aborted marks its rank broken, and every part of the group then fails with `Aborted`
//! naming it, in every process.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use xpu_hal::shm::{Backoff, Exchange, Stopped, Until};
use xpu_plugin_sdk::{
    BufferRange, Error, Group, GroupAcross, GroupCall, GroupConfig, GroupPart, NewGroup, Result,
};

use crate::arena::Buffer;
use crate::config::SimConfig;
use crate::group::{described, write_result};
use crate::SimNpu;

/// How long a part waits for its peers, and joining for the other processes, when the
/// host gives no timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The first bytes of every segment's name.
const PREFIX: &str = "xpu-simccl-";

/// A fresh identifier: the path of a segment no group uses yet.
pub(crate) fn group_id() -> Result<Vec<u8>> {
    Exchange::fresh_name(PREFIX)
        .to_str()
        .map(|p| p.as_bytes().to_vec())
        .ok_or_else(|| Error::unavailable("the shared-memory folder has a name that is not UTF-8"))
}

/// The segment an identifier names, refusing anything [`group_id`] would not make.
fn path_of(id: &[u8]) -> Result<PathBuf> {
    std::str::from_utf8(id)
        .ok()
        .map(PathBuf::from)
        .filter(|p| Exchange::is_fresh_name(p, PREFIX))
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "the group identifier {:?} is not one simccl made; pass the bytes group_id returned",
                String::from_utf8_lossy(id)
            ))
        })
}

/// A group across processes, this process's ranks of it.
pub struct SimGroupAcross {
    inner: Arc<Inner>,
    config: SimConfig,
}

struct Inner {
    seg: Exchange,
    /// The ranks of this process's devices, in their order.
    ranks: Vec<usize>,
    timeout: Duration,
    /// The next step number to hand out (steps start at 1).
    next_step: AtomicU64,
    /// Operations numbered as they are enqueued, for messages.
    next_op: AtomicU64,
    aborted: AtomicBool,
    /// Parts enqueued and not yet finished, with a condition for destroy.
    pending: Mutex<usize>,
    settled: Condvar,
    running: AtomicUsize,
    name: String,
}

impl SimGroupAcross {
    /// Joins the group `across` names with `devices` (checked by the SDK: distinct open
    /// devices, one distinct rank each below the size): returns once every rank of
    /// every process has joined, or fails with `Timeout`.
    pub(crate) fn join(
        devices: &[&crate::SimDevice],
        config: SimConfig,
        group: &GroupConfig,
        across: &GroupAcross,
    ) -> Result<NewGroup<SimNpu>> {
        if !config.ccl {
            return Err(Error::unsupported(
                "simccl is turned off (XPU_SIMNPU_CCL=off); the host's own algorithms run",
            ));
        }
        let path = path_of(&across.id)?;
        let slot = usize::try_from(config.ccl_slot)
            .map_err(|_| Error::invalid_argument("XPU_SIMNPU_CCL_SLOT does not fit"))?
            .next_multiple_of(64);
        let timeout = group.timeout.unwrap_or(DEFAULT_TIMEOUT);
        let seg =
            Exchange::join(&path, across.size, slot, &across.ranks, timeout).map_err(|e| {
                let text = format!("simccl across processes: {e}");
                match e {
                    xpu_hal::Error::Timeout { .. } => Error::timeout(text),
                    xpu_hal::Error::InvalidArgument { .. } => Error::invalid_argument(text),
                    _ => Error::unavailable(text),
                }
            })?;
        let names: Vec<String> = devices.iter().map(|d| d.index().to_string()).collect();
        let inner = Arc::new(Inner {
            seg,
            ranks: across.ranks.clone(),
            timeout,
            next_step: AtomicU64::new(1),
            next_op: AtomicU64::new(0),
            aborted: AtomicBool::new(false),
            pending: Mutex::new(0),
            settled: Condvar::new(),
            running: AtomicUsize::new(0),
            name: format!(
                "simccl across processes (ranks {:?} of {} on plugin.simnpu:{})",
                across.ranks,
                across.size,
                names.join(",")
            ),
        });
        Ok(described(
            Box::new(SimGroupAcross { inner, config }),
            &config,
        ))
    }
}

/// How an operation is cut into steps: bytes per block and rank (`total`), blocks per
/// rank's contribution, element size, and bytes per block in one step.
#[derive(Debug, Clone, Copy)]
struct Plan {
    total: usize,
    blocks: usize,
    chunk: usize,
    steps: u64,
}

fn plan(call: GroupCall, n: usize, slot: usize) -> Result<Plan> {
    let (total, blocks, elem) = match call {
        GroupCall::AllReduce { count, dtype, .. } | GroupCall::Reduce { count, dtype, .. } => {
            (count * dtype.size(), 1, dtype.size())
        }
        GroupCall::ReduceScatter { count, dtype, .. } => (count * dtype.size(), n, dtype.size()),
        GroupCall::Broadcast { bytes, .. } | GroupCall::AllGather { bytes } => (bytes, 1, 1),
        GroupCall::AllToAll { bytes } => (bytes, n, 1),
    };
    let total = usize::try_from(total)
        .map_err(|_| Error::invalid_argument("the operation does not fit this machine"))?;
    let elem = elem as usize;
    let chunk = (slot / blocks / elem) * elem;
    if chunk == 0 {
        return Err(Error::unsupported(format!(
            "simccl's slots of {slot} bytes cannot stage {blocks} blocks of one element; raise XPU_SIMNPU_CCL_SLOT"
        )));
    }
    Ok(Plan {
        total,
        blocks,
        chunk,
        steps: total.div_ceil(chunk).max(1) as u64,
    })
}

/// The words that describe an operation, so that processes that enqueue different
/// ones find out instead of exchanging the wrong bytes.
fn describe(call: GroupCall) -> xpu_hal::shm::Words {
    let (kind, count, dtype, op, root) = match call {
        GroupCall::AllReduce { count, dtype, op } => (1u64, count, dtype.raw(), op.raw(), 0),
        GroupCall::Reduce {
            count,
            dtype,
            op,
            root,
        } => (2, count, dtype.raw(), op.raw(), root as u64),
        GroupCall::Broadcast { bytes, root } => (3, bytes, 0, 0, root as u64),
        GroupCall::AllGather { bytes } => (4, bytes, 0, 0, 0),
        GroupCall::ReduceScatter { count, dtype, op } => (5, count, dtype.raw(), op.raw(), 0),
        GroupCall::AllToAll { bytes } => (6, bytes, 0, 0, 0),
    };
    [kind, count, u64::from(dtype), u64::from(op), root, 0, 0, 0]
}

impl Group<SimNpu> for SimGroupAcross {
    fn run(&self, call: GroupCall, parts: Vec<GroupPart<'_, SimNpu>>) -> Result<()> {
        let inner = &self.inner;
        if inner.aborted.load(Ordering::Acquire) {
            return Err(Error::aborted(format!(
                "{}: the group was aborted",
                inner.name
            )));
        }
        let plan = plan(call, inner.seg.parties(), inner.seg.slot_len())?;
        let first = inner.next_step.fetch_add(plan.steps, Ordering::Relaxed);
        let op = inner.next_op.fetch_add(1, Ordering::Relaxed);
        // The parts start only once all are enqueued; a part refused on the way fails
        // the others (the caller learns of it from this call), so no peer hangs.
        let gate = Arc::new(Gate::default());
        let mut enqueueing = Enqueueing {
            gate: &gate,
            done: false,
        };
        for (i, p) in parts.into_iter().enumerate() {
            // The SDK gives one part per device of this process, in their order.
            let written = p.recv.as_ref().map_or(0, |r| r.length);
            let part = Part {
                inner: inner.clone(),
                gate: gate.clone(),
                rank: inner.ranks[i],
                call,
                plan,
                first,
                op,
                send: p.send,
                recv: p.recv,
                finished: false,
            };
            *inner.pending.lock().unwrap_or_else(|p| p.into_inner()) += 1;
            p.stream
                .run(self.config.copy_time(written), move || part.run())?;
        }
        enqueueing.done = true;
        gate.open(true);
        Ok(())
    }

    fn abort(&self) {
        self.inner.aborted.store(true, Ordering::Release);
        for &r in &self.inner.ranks {
            self.inner.seg.set_broken(r, 1);
        }
    }
}

impl Drop for SimGroupAcross {
    /// `group_destroy`: lets the parts already enqueued finish (for at most the group's
    /// timeout), then fails those left, as an abort would, and returns once none runs.
    fn drop(&mut self) {
        let inner = &self.inner;
        let deadline = Instant::now() + inner.timeout;
        let mut pending = inner.pending.lock().unwrap_or_else(|p| p.into_inner());
        while *pending > 0 && Instant::now() < deadline {
            pending = inner
                .settled
                .wait_timeout(pending, Duration::from_millis(20))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        drop(pending);
        inner.aborted.store(true, Ordering::Release);
        let mut backoff = Backoff::default();
        while inner.running.load(Ordering::Acquire) > 0 {
            backoff.pause();
        }
    }
}

/// Whether an operation's parts may start: `Some(true)` once every part is enqueued,
/// `Some(false)` when enqueueing stopped part-way.
#[derive(Default)]
struct Gate {
    state: Mutex<Option<bool>>,
    changed: Condvar,
}

impl Gate {
    fn open(&self, go: bool) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = Some(go);
        self.changed.notify_all();
    }

    fn wait(&self) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(go) = *st {
                return go;
            }
            st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// An operation being enqueued: dropped before `done` (a part refused, a panic), it
/// tells the parts already enqueued not to run.
struct Enqueueing<'a> {
    gate: &'a Gate,
    done: bool,
}

impl Drop for Enqueueing<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.gate.open(false);
        }
    }
}

/// One rank's part of one operation: the job on its stream.
struct Part {
    inner: Arc<Inner>,
    gate: Arc<Gate>,
    rank: usize,
    call: GroupCall,
    plan: Plan,
    /// The operation's first step.
    first: u64,
    /// The operation's number, for messages.
    op: u64,
    send: Option<BufferRange<Buffer>>,
    recv: Option<BufferRange<Buffer>>,
    finished: bool,
}

impl Part {
    fn run(mut self) -> Result<()> {
        let inner = self.inner.clone();
        inner.running.fetch_add(1, Ordering::AcqRel);
        let outcome = if self.gate.wait() {
            self.steps()
        } else {
            // Enqueueing failed part-way: the peers must not wait for this rank.
            self.break_rank();
            Ok(())
        };
        if outcome.is_err() {
            self.break_rank();
        }
        self.finish();
        inner.running.fetch_sub(1, Ordering::AcqRel);
        outcome
    }

    fn break_rank(&self) {
        self.inner.seg.set_broken(self.rank, 1);
    }

    fn finish(&mut self) {
        self.finished = true;
        let mut pending = self.inner.pending.lock().unwrap_or_else(|p| p.into_inner());
        *pending = pending.saturating_sub(1);
        self.inner.settled.notify_all();
    }

    /// The ranks whose slots this part reads.
    fn needs(&self) -> Vec<usize> {
        let n = self.inner.seg.parties();
        match self.call {
            GroupCall::Reduce { root, .. } if self.rank != root => Vec::new(),
            GroupCall::Broadcast { root, .. } if self.rank == root => Vec::new(),
            GroupCall::Broadcast { root, .. } => vec![root],
            _ => (0..n).collect(),
        }
    }

    /// Waits until every rank of `ranks` has reached `until`, failing on an abort, a
    /// broken rank or the deadline.
    fn wait_for(&self, ranks: &[usize], until: Until, what: &str) -> Result<()> {
        let inner = &self.inner;
        let seg = &inner.seg;
        let deadline = Instant::now() + inner.timeout;
        let aborted = || inner.aborted.load(Ordering::Acquire);
        match seg.wait(ranks, until, deadline, &aborted) {
            Ok(()) => Ok(()),
            Err(Stopped::Cancelled) => {
                Err(Error::aborted(format!("{}: the group was aborted", inner.name)))
            }
            Err(Stopped::Broken { party: q, .. }) => Err(Error::aborted(format!(
                "{}: rank {q} (process {}) failed, never ran its part or aborted the group; operation {} cannot finish",
                inner.name,
                seg.pid(q),
                self.op
            ))),
            Err(Stopped::Deadline(missing)) => {
                let missing: Vec<String> = missing
                    .iter()
                    .map(|&q| format!("{q} (process {})", seg.pid(q)))
                    .collect();
                Err(Error::timeout(format!(
                    "{}: rank {} waited {:?} in operation {} for rank(s) {} to {what} (is their process stalled, or did it enqueue other operations?)",
                    inner.name,
                    self.rank,
                    inner.timeout,
                    self.op,
                    missing.join(", ")
                )))
            }
        }
    }

    /// Every step of the operation.
    fn steps(&self) -> Result<()> {
        let inner = &self.inner;
        let seg = &inner.seg;
        let n = seg.parties();
        let all: Vec<usize> = (0..n).collect();
        let needs = self.needs();
        let words = describe(self.call);
        let Plan {
            total,
            blocks,
            chunk,
            steps,
        } = self.plan;
        let me = self.rank;
        for c in 0..steps {
            let step = self.first + c;
            let lo = (c as usize) * chunk;
            let len = chunk.min(total.saturating_sub(lo));
            // My slot is free once every rank is done with the step before.
            self.wait_for(&all, Until::Done(step - 1), "finish the step before")?;
            self.contribute(lo, len)?;
            seg.post(me, step, &words);
            self.wait_for(&needs, Until::Posted(step), "post their data")?;
            if let Some(q) = needs.iter().copied().find(|&q| seg.words(q, step) != words) {
                return Err(Error::invalid_argument(format!(
                    "{}: rank {q} (process {}) enqueued another operation than rank {me}'s {:?} as operation {}; every process must enqueue the same operations in the same order",
                    inner.name,
                    seg.pid(q),
                    self.call,
                    self.op
                )));
            }
            self.result(&needs, lo, len, blocks);
            seg.done(me, step);
        }
        Ok(())
    }

    /// Copies this rank's data for the step (`len` bytes of each block from `lo`) into
    /// its slot.
    fn contribute(&self, lo: usize, len: usize) -> Result<()> {
        let seg = &self.inner.seg;
        let from = match self.call {
            GroupCall::Reduce { .. }
            | GroupCall::AllReduce { .. }
            | GroupCall::AllGather { .. } => self.send.as_ref(),
            GroupCall::Broadcast { root, .. } if root == self.rank => {
                self.send.as_ref().or(self.recv.as_ref())
            }
            GroupCall::Broadcast { .. } => None,
            GroupCall::ReduceScatter { .. } | GroupCall::AllToAll { .. } => self.send.as_ref(),
        };
        let Some(from) = from else {
            return Ok(());
        };
        let blocks = self.plan.blocks;
        let base = from.buffer.ptr(from.offset);
        for b in 0..blocks {
            let at = b * self.plan.total + lo;
            if at + len > from.length as usize {
                return Err(Error::internal(format!(
                    "{}: block {b} of the step lies beyond the send range",
                    self.inner.name
                )));
            }
            // SAFETY: the SDK checked that the range lies in a live buffer of this
            // rank's device; this job runs on the rank's stream, which orders it against
            // every other use; `at + len` is within the range (checked above) and `b ×
            // len + len` within the slot (the plan's chunk fits `blocks` in a slot); the
            // slot is this rank's, which no one reads until it posts.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    base.add(at),
                    seg.slot_ptr(self.rank).add(b * len),
                    len,
                )
            };
        }
        Ok(())
    }

    /// Writes this rank's result of the step from the slots of the ranks it needs.
    fn result(&self, needs: &[usize], lo: usize, len: usize, blocks: usize) {
        let Some(recv) = &self.recv else {
            return;
        };
        let seg = &self.inner.seg;
        let total = self.plan.total;
        let n = seg.parties();
        // SAFETY: every rank of `needs` has posted this step and none writes its slot
        // again before this rank is done with it.
        let slots: Vec<&[u8]> = needs
            .iter()
            .map(|&q| unsafe { seg.slot(q, len * blocks) })
            .collect();
        let base = recv.buffer.ptr(recv.offset);
        // Writes `bytes` at `at` of the receive range.
        let put = |at: usize, bytes: &[u8]| {
            if at + bytes.len() <= recv.length as usize {
                // SAFETY: within the range (checked); this job is the only user of it on
                // its stream, and the data comes from the slots, never from the range.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(at), bytes.len()) };
            }
        };
        match self.call {
            GroupCall::AllReduce { .. }
            | GroupCall::Reduce { .. }
            | GroupCall::ReduceScatter { .. } => {
                if lo + len > recv.length as usize {
                    return;
                }
                // SAFETY: `lo .. lo + len` lies within the range (checked); only this job
                // writes it, and the inputs are the slots.
                let out = unsafe { std::slice::from_raw_parts_mut(base.add(lo), len) };
                // A reduce-scatter chunk: rank `me` reduces its block of each slot, which
                // `write_result` finds at `me × len`.
                write_result(self.call, self.rank, n, &slots, out);
            }
            GroupCall::Broadcast { .. } => {
                if let Some(root) = slots.first() {
                    put(lo, root);
                } else if let (Some(s), GroupCall::Broadcast { .. }) = (&self.send, self.call) {
                    // The root: its data goes to its recv when it sent from elsewhere.
                    if !s.same_as(recv) {
                        // SAFETY: this rank's own slot, posted by this job.
                        put(lo, unsafe { seg.slot(self.rank, len) });
                    }
                }
            }
            GroupCall::AllGather { .. } => {
                for (q, s) in slots.iter().enumerate() {
                    put(q * total + lo, s);
                }
            }
            GroupCall::AllToAll { .. } => {
                let me = self.rank;
                for (q, s) in slots.iter().enumerate() {
                    put(q * total + lo, &s[me * len..(me + 1) * len]);
                }
            }
        }
    }
}

impl Drop for Part {
    /// A part dropped unrun (its stream had failed, its device was lost, its stream was
    /// destroyed) breaks its rank, so that the other processes' parts do not wait for it.
    fn drop(&mut self) {
        if !self.finished {
            self.break_rank();
            self.finish();
        }
    }
}
